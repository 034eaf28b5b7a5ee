//! The durable store: a redb database holding the delta log, the objects, the secondary indexes
//! and each scope's resourceVersion, always changed together in one write transaction.
//!
//! It owns everything that touches redb; nothing above it opens a transaction. Writes go through
//! one [`Writer`] thread (redb is blocking, so it never runs inside an async task); reads go
//! through cheap cloned [`Store`] / [`LogReader`] handles over MVCC read transactions that the
//! writer never blocks.
//!
//! ## Usage
//!
//! ```no_run
//! use durable_informer::object::{RawObject, ScopeSpec};
//! use durable_informer::store::{Batch, Delta, DeltaKind, DurableStore, StoreConfig};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let db = DurableStore::open(StoreConfig::new("/tmp/cache.redb"))?;
//! let scope = db.writer().register_scope_blocking(&ScopeSpec::new("", "v1", "configmaps"))?;
//! let obj = RawObject::from_json(r#"{"metadata":{"name":"a","namespace":"ns","resourceVersion":"5"}}"#.as_bytes().to_vec())?;
//! db.writer().apply_blocking(Batch::new(scope).delta(DeltaKind::Added, obj).rv("5"))?;
//! let store = db.store(scope);
//! assert_eq!(store.list()?.len(), 1);
//! # Ok(()) }
//! ```
//!
//! ## Crash safety
//!
//! Invariant 1: log entries, object rows, index rows and a scope's RV change in one transaction,
//! so after any crash the database equals the state at some committed RV. A commit is
//! acknowledged only after redb returned from a durable commit, unless
//! [`StoreConfig::durable`] was turned off or the batch was sent with
//! [`Batch::deferred_fsync`]: then it is acknowledged once committed, and a crash can take the
//! database back to the last durable commit (redb persists a non-durable commit only with the
//! next durable one; [`Writer::durable`] says which seq that is, and for deferred batches a
//! durable commit follows within [`StoreConfig::fsync_delay`]).

mod changes;
mod check;
mod codec;
mod dict;
mod error;
mod fence;
mod index;
mod inspect;
pub(crate) mod memory;
mod metrics;
mod migrate;
mod read;
mod release;
mod rules;
mod schema;
mod writer;

use crate::util::RwLocked;
use std::fs::OpenOptions;
use std::io::Read;
#[cfg(unix)]
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use changes::{Change, Item, Reader, Stream, StreamRead, MAX_ENTRIES as MAX_STREAM_ENTRIES};
pub use check::CheckReport;
pub use codec::{CodecError, Compression, DeltaKind, ScopeRecord, ShardRecord};
pub(crate) use dict::Packed;
pub use error::StoreError;
pub use index::{IndexFunc, Indexer, LABELS, NAMESPACE};
pub use inspect::{ReadOnlyStore, ScopeUsage};
pub(crate) use memory::MemoryBudget;
pub use memory::MemoryStats;
pub(crate) use read::{DamagedEntry, LogEntry, ObjectEntry};
pub use read::{IndexStatus, LogReader, LogRecord, Snapshot, Store, StoredObject};
pub use schema::{CursorName, IndexName, IndexValue, ScopeId, Seq};
pub use writer::{
    Batch, Committed, CompactReport, Delta, Durability, LogPin, RelistSummary, ScopeRegistration, Subscription, Writer,
};

use crate::object::ScopeSpec;

use index::IndexRegistry;

/// The newest schema version this build writes (see `migrations/`).
pub const SCHEMA_VERSION: u32 = migrate::LATEST;

/// How to open a [`DurableStore`].
#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub(crate) path: PathBuf,
    pub(crate) durable: bool,
    /// redb's page cache; `None`: a share of the memory budget.
    pub(crate) cache_bytes: Option<usize>,
    pub(crate) max_batch_deltas: usize,
    pub(crate) max_batch_bytes: usize,
    pub(crate) compression: Compression,
    pub(crate) retention_entries: Option<u64>,
    pub(crate) retention_age: Option<Duration>,
    pub(crate) check_integrity: bool,
    pub(crate) backend_wrapper: Option<WrapBackend>,
    pub(crate) clock: Option<WrapClock>,
    pub(crate) compact_step: usize,
    pub(crate) backfill_step: usize,
    pub(crate) object_cache_bytes: usize,
    pub(crate) memory_budget: usize,
    pub(crate) fsync_delay: Option<Duration>,
    pub(crate) drop_unused_scopes_after: Option<Duration>,
    pub(crate) live_inspection: bool,
}

/// Default [`StoreConfig::fsync_delay`]: 10 ms.
pub const DEFAULT_FSYNC_DELAY: Duration = Duration::from_millis(10);

/// Default byte budget of an informer's object cache: 512 MiB (about 40,000 objects of 4 KB).
pub const DEFAULT_OBJECT_CACHE_BYTES: usize = 512 << 20;

/// Default [`StoreConfig::memory_budget`]: 1 GiB for the object caches of every informer of
/// one store together.
pub const DEFAULT_MEMORY_BUDGET: usize = 1 << 30;

/// Most log entries one compaction transaction removes (automatic or explicit).
pub const COMPACT_STEP: usize = 4096;
/// Most objects one index-backfill transaction indexes.
pub const BACKFILL_STEP: usize = 1000;

/// The store's source of wall-clock time; see [`StoreConfig::clock`].
pub type Clock = Arc<dyn Fn() -> std::time::SystemTime + Send + Sync>;

/// [`Clock`] with a `Debug` impl, so that [`StoreConfig`] stays `Debug`.
#[derive(Clone)]
pub(crate) struct WrapClock(Clock);

impl std::fmt::Debug for WrapClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Clock")
    }
}

/// A function that wraps the file backend redb reads and writes through; see
/// [`StoreConfig::backend_wrapper`].
pub type BackendWrapper = Arc<dyn Fn(redb::backends::FileBackend) -> Box<dyn redb::StorageBackend> + Send + Sync>;

/// [`BackendWrapper`] with a `Debug` impl, so that [`StoreConfig`] stays `Debug`.
#[derive(Clone)]
pub(crate) struct WrapBackend(BackendWrapper);

impl std::fmt::Debug for WrapBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BackendWrapper")
    }
}

impl StoreConfig {
    /// Defaults: durable commits, a page cache of a thirty-second of the memory budget (32 MiB
    /// of the default 1 GiB), group commits of up to 10,000 deltas or
    /// 64 MiB, zstd level 1 with a dictionary trained per scope on its first objects
    /// ([`Compression::ZstdDict`]), log retention of 1,000,000 entries, applied automatically,
    /// and no retention by age.
    ///
    /// Dictionary compression is the default because it wins on both ends (`benches/store.rs`,
    /// ~7 KB Pods, batches of 1000): ~8x less data than uncompressed and 2x less than plain zstd,
    /// and faster durable ingest (fewer pages written), with reads on par.
    #[must_use]
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            durable: true,
            cache_bytes: None,
            max_batch_deltas: 10_000,
            max_batch_bytes: 64 << 20,
            compression: Compression::ZstdDict(1),
            retention_entries: Some(1_000_000),
            retention_age: None,
            check_integrity: false,
            backend_wrapper: None,
            clock: None,
            compact_step: COMPACT_STEP,
            backfill_step: BACKFILL_STEP,
            object_cache_bytes: DEFAULT_OBJECT_CACHE_BYTES,
            memory_budget: DEFAULT_MEMORY_BUDGET,
            fsync_delay: Some(DEFAULT_FSYNC_DELAY),
            drop_unused_scopes_after: None,
            live_inspection: false,
        }
    }

    /// Drops the scopes no process has used for longer than `period` (default `None`: scopes
    /// stay until dropped by hand, with [`Writer::drop_scope`] or `durable-informer scopes drop`).
    ///
    /// A scope is in use while an informer of a process that has the database open registered
    /// it: the writer records its last use when it is registered, every few minutes while it
    /// stays registered, and when the store closes. A selector, namespace or version change
    /// makes a new scope and leaves the old one unused; with this set it is dropped once the
    /// period has passed. The writer looks right after open and then every `period / 10`
    /// (at least every 10 minutes), so set it well above the longest time a process may be
    /// stopped: a scope dropped that way that comes back later starts cold (a full LIST).
    /// Each drop is logged and counted (`durable_informer_scopes_dropped_total`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use durable_informer::store::StoreConfig;
    /// let config = StoreConfig::new("/tmp/cache.redb").drop_unused_scopes_after(Some(Duration::from_secs(7 * 24 * 3600)));
    /// # let _ = config;
    /// ```
    #[must_use]
    pub fn drop_unused_scopes_after(mut self, period: Option<Duration>) -> Self {
        self.drop_unused_scopes_after = period;
        self
    }

    /// Whether other processes may read the database while this one writes it (default false):
    /// `durable-informer get`, `list`, `stats`, `check` and the other inspection commands open
    /// it read-only beside the writer (redb's single-writer mode, byte-range file locks).
    ///
    /// The price is every commit's fsync: redb shares only durable commits with other
    /// processes, so with this on no batch is deferred ([`fsync_delay`](Self::fsync_delay) is
    /// `None`) and [`durable(false)`](Self::durable) is refused at open. Without it the writer
    /// holds the file exclusively and an inspection command is refused with exit 4 while it
    /// runs. `docs/cli.md` has the measured cost.
    ///
    /// ```
    /// use durable_informer::store::StoreConfig;
    /// let config = StoreConfig::new("/tmp/cache.redb").live_inspection(true);
    /// # let _ = config;
    /// ```
    #[must_use]
    pub fn live_inspection(mut self, on: bool) -> Self {
        self.live_inspection = on;
        self
    }

    /// How long a [deferred](Durability::Deferred) batch (every watch batch) may wait for the
    /// durable commit (fsync) that follows it (default [`DEFAULT_FSYNC_DELAY`], 10 ms; `None`:
    /// deferred batches are fsynced before they are acknowledged or shown to anyone). That
    /// commit starts this long after the first deferred batch it covers, or when the previous
    /// durable commit's fsync ends if that is later; its fsync runs off the writer thread, so
    /// the batches that arrive meanwhile are committed and shown without waiting for the disk
    /// (nothing reaches the file until that fsync has ended).
    ///
    /// Meanwhile the batch is committed, acknowledged, and shown to informers' caches, listers
    /// and volatile handlers; should the durable commit fail, they are told of a rollback and
    /// the reflector fetches the lost events again (its next batch, which requires the lost
    /// one, is refused, and it re-watches from what the file holds). Durable handlers only ever
    /// receive events that are on disk ([`Writer::durable`]), their initial adds included, and
    /// the persisted resourceVersion moves with the data, so a crash in between loses only what
    /// the restart fetches again from the server. [Relaxed](Durability::Relaxed) batches (bulk
    /// loads) are never fsynced on their own, whatever this setting. `docs/benchmarks.md` has
    /// the latency this buys.
    #[must_use]
    pub fn fsync_delay(mut self, delay: Option<Duration>) -> Self {
        self.fsync_delay = delay;
        self
    }

    /// The default byte budget of each informer's object cache (default
    /// [`DEFAULT_OBJECT_CACHE_BYTES`]; 0 leaves every object's JSON on disk). The cache holds
    /// every key, metadata and index posting of its scope, and the JSON and decoded objects of
    /// the most recently written or read objects within this budget (each charged what holds it,
    /// the database's compressed blob or the JSON, plus its decoded form at the size a decode
    /// of its type was measured to take), so listers answer without touching redb.
    /// [`InformerBuilder::object_cache_bytes`](crate::informer::InformerBuilder::object_cache_bytes)
    /// sets it per informer.
    #[must_use]
    pub fn object_cache_bytes(mut self, bytes: usize) -> Self {
        self.object_cache_bytes = bytes;
        self
    }

    /// The bytes this store may hold in memory, for every informer on it together (default
    /// [`DEFAULT_MEMORY_BUDGET`], 1 GiB): one budget per process, however many informers it
    /// runs. It counts, as they are allocated:
    ///
    /// * redb's page cache ([`cache_bytes`](Self::cache_bytes); unless set, a thirty-second of
    ///   the budget, 16 to 32 MiB, at most a quarter);
    /// * each informer's keys, metadata and index postings (always held: listers and handlers
    ///   need them), with what the allocator keeps around them;
    /// * the objects the caches keep, compressed as stored or as JSON, and decoded once read
    ///   (charged what holds them plus their decoded form, measured per type);
    /// * the change stream: changes published and not yet read by every informer's cache,
    ///   bounded at a thirty-second of the budget (4 to 32 MiB); past it the JSON of committed
    ///   changes is dropped from the stream and read back from redb by whoever needs it;
    /// * list pages in flight (fetched and not yet committed), admitted by every reflector
    ///   through one gate of a thirty-second of the budget (4 to 32 MiB).
    ///
    /// Only the caches' object JSON gives way: when the total is over, the cache that took it
    /// over evicts its own least recently written or read objects' JSON, and if it has none
    /// left the other caches evict theirs; evicted objects are read back from redb when
    /// needed. When what cannot give way is larger than the budget, the store logs a warning
    /// once and sets `durable_informer_memory_budget_exceeded`: the process then holds no
    /// object JSON and still exceeds the budget by the difference.
    /// [`object_cache_bytes`](Self::object_cache_bytes) stays a cap per informer, and
    /// [`DurableStore::memory_stats`] shows every part. Not counted: what the allocator keeps
    /// after freeing (the application's choice of allocator and its settings), the Kubernetes
    /// client's own buffers, and what handlers and reconcilers allocate.
    /// `docs/deploying.md#sizing` has the bytes per object measured, the sizing rule, and the
    /// command that measures them.
    ///
    /// ```
    /// use durable_informer::store::StoreConfig;
    /// // Twenty informers in 512 MiB, of which 16 MiB are redb's page cache.
    /// let config = StoreConfig::new("/tmp/cache.redb").memory_budget(512 << 20);
    /// # let _ = config;
    /// ```
    #[must_use]
    pub fn memory_budget(mut self, bytes: usize) -> Self {
        self.memory_budget = bytes;
        self
    }

    /// Whether commits are fsynced before they are acknowledged (default true). Without it a
    /// crash can lose the acknowledged commits since the last durable one (redb persists them
    /// only with a durable commit); the database stays consistent. What a scope is (its
    /// registration, indexes, shard range, a reset or drop), the cluster identity and the
    /// store's close are fsynced all the same. Durable handlers are then told of each commit
    /// as it commits: a crash can take back what they were told, while a reopen after an I/O
    /// error (which takes back the same commits) is told to them as volatile handlers are told
    /// a rollback (each key told since, as it is now).
    #[must_use]
    pub fn durable(mut self, durable: bool) -> Self {
        self.durable = durable;
        self
    }

    /// redb's page cache size (default: a thirty-second of the
    /// [`memory_budget`](Self::memory_budget), 16 to 32 MiB, at most a quarter). It is part of
    /// the memory budget either way. It bounds the pages redb holds written and not yet
    /// durable as well as those it caches for reads, so during a cold sync (one durable commit
    /// at its end) it is filled to this size; a larger one buys fewer reads from the file for
    /// objects the informers' caches do not hold.
    #[must_use]
    pub fn cache_bytes(mut self, bytes: usize) -> Self {
        self.cache_bytes = Some(bytes);
        self
    }

    /// Bounds of one group commit.
    #[must_use]
    pub fn group_commit(mut self, max_deltas: usize, max_bytes: usize) -> Self {
        self.max_batch_deltas = max_deltas.max(1);
        self.max_batch_bytes = max_bytes.max(1);
        self
    }

    /// Compression of stored object bytes.
    #[must_use]
    pub fn compression(mut self, compression: Compression) -> Self {
        self.compression = compression;
        self
    }

    /// Keep at most this many log entries (compaction never removes entries a durable cursor
    /// has not passed). `None` keeps everything.
    ///
    /// The writer applies it by itself: once the log holds more than
    /// `entries + min(entries / 10, 4096)` entries it compacts it down to `entries`, in
    /// transactions of at most 4,096 entries interleaved with incoming batches, so a large
    /// backlog neither makes one huge transaction nor holds up ingest for long.
    /// [`Writer::compact`] applies it on demand. With `None` here and no
    /// [`retention_age`](Self::retention_age), the store never compacts on its own.
    ///
    /// ```
    /// use durable_informer::store::StoreConfig;
    /// // Keep the last 100,000 deltas (plus whatever a durable handler has not seen yet).
    /// let config = StoreConfig::new("/tmp/cache.redb").retention_entries(Some(100_000));
    /// # let _ = config;
    /// ```
    #[must_use]
    pub fn retention_entries(mut self, entries: Option<u64>) -> Self {
        self.retention_entries = entries;
        self
    }

    /// Also remove log entries committed longer ago than `age` (measured from the commit that
    /// wrote them; entries written before schema v3 count as committed when the database was
    /// upgraded). Entries a durable cursor has not passed always stay. Applied by the writer on
    /// its own like [`retention_entries`](Self::retention_entries): after commits, and every
    /// `age / 10` (at least 1 s, at most 60 s) while idle.
    ///
    /// Default `None`: the entry count already bounds disk use, and an age limit ties the
    /// history that `history`, `export` and time travel can show to the wall clock — a
    /// controller stopped over a long weekend would come back to an emptied log. Set it when old
    /// object versions must not linger on disk (for example Secrets that were deleted or
    /// rotated: the log keeps their earlier versions until they are compacted away).
    ///
    /// ```
    /// use std::time::Duration;
    /// use durable_informer::store::StoreConfig;
    /// // At most 1,000,000 entries, none older than a day.
    /// let config = StoreConfig::new("/tmp/cache.redb").retention_age(Some(Duration::from_secs(24 * 3600)));
    /// # let _ = config;
    /// ```
    #[must_use]
    pub fn retention_age(mut self, age: Option<Duration>) -> Self {
        self.retention_age = age;
        self
    }

    /// Verify every page checksum on open (slow for large files; catches tampered files).
    #[must_use]
    pub fn check_integrity(mut self, check: bool) -> Self {
        self.check_integrity = check;
        self
    }

    /// Wraps the file backend redb does its I/O through, for fault injection in tests (fail a
    /// sync, a write, return ENOSPC, …). The file is still opened here (mode 0600, magic check)
    /// and the wrapper receives redb's own `FileBackend` over it. The writer calls it again when
    /// it reopens the database after an I/O error, so the wrapper applies to every open.
    /// Not meant for production use.
    #[doc(hidden)]
    #[must_use]
    pub fn backend_wrapper(mut self, wrap: BackendWrapper) -> Self {
        self.backend_wrapper = Some(WrapBackend(wrap));
        self
    }

    /// Replaces the wall clock the store dates commits with and measures
    /// [`retention_age`](Self::retention_age) against, for tests that age the log without
    /// waiting. Not meant for production use.
    #[doc(hidden)]
    #[must_use]
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = Some(WrapClock(clock));
        self
    }

    /// Changes how many log entries one compaction transaction removes and how many objects one
    /// backfill transaction indexes (defaults [`COMPACT_STEP`], [`BACKFILL_STEP`]), so tests can
    /// make small data span several transactions. Not meant for production use.
    #[doc(hidden)]
    #[must_use]
    pub fn maintenance_steps(mut self, compact_entries: usize, backfill_objects: usize) -> Self {
        self.compact_step = compact_entries.max(1);
        self.backfill_step = backfill_objects.max(1);
        self
    }

    /// The database path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Now, in unix milliseconds, by the configured clock (0 before 1970).
    pub(crate) fn now_ms(&self) -> u64 {
        let now = match &self.clock {
            Some(WrapClock(clock)) => clock(),
            None => std::time::SystemTime::now(),
        };
        now.duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// How a handle shares its file with other processes. A writer opened with
/// [`StoreConfig::live_inspection`] writes in redb's single-writer mode, where any number of
/// [`ReadOnlyStore`]s in other processes read alongside it and a second writer is still refused
/// ([`StoreError::Locked`]); any other writer holds the whole file. Read-only handles always ask
/// for the single-writer mode: it reads a file no process has open, and one such a writer has.
pub(crate) fn concurrency(live_inspection: bool) -> redb::ConcurrencyMode {
    if live_inspection {
        redb::ConcurrencyMode::SingleWriter
    } else {
        redb::ConcurrencyMode::ExclusiveWriter
    }
}

/// redb's page cache: as configured, else its share of the memory budget.
fn redb_cache_bytes(config: &StoreConfig) -> usize {
    config
        .cache_bytes
        .unwrap_or_else(|| MemoryBudget::redb_share(config.memory_budget))
}

/// Opens (or creates, with mode 0600) the redb file of `config`, through its backend wrapper.
fn open_database(config: &StoreConfig, fence: &Arc<fence::Fence>) -> Result<redb::Database, StoreError> {
    let path = config.path.clone();
    let io = |source| StoreError::Io {
        path: path.clone(),
        source,
    };
    // Invariant 5: the file may hold Secrets, so it is created readable by the owner only
    // (a Unix mode; elsewhere the directory's access rules decide).
    let mut options = OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    options.mode(0o600);
    let mut file = options.open(&path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    if len > 0 {
        let mut magic = [0u8; 9];
        if (len as usize) < magic.len() || file.read_exact(&mut magic).is_err() || magic != REDB_MAGIC {
            return Err(StoreError::NotADatabase { path });
        }
    }
    let backend = redb::backends::FileBackend::new(file).map_err(|e| classify_open(&path, e))?;
    let mut builder = redb::Builder::new();
    builder.set_cache_size(redb_cache_bytes(config));
    builder.set_concurrency_mode(concurrency(config.live_inspection));
    builder.set_check_integrity_on_open(config.check_integrity);
    // redb may panic on a damaged file instead of returning an error; a damaged file must give
    // an error that names it, so the panic is caught here, at the one place files are opened.
    let backend: Box<dyn redb::StorageBackend> = match &config.backend_wrapper {
        Some(WrapBackend(wrap)) => wrap(backend),
        None => Box::new(backend),
    };
    let backend = fence::Fenced::new(backend, fence.clone(), &path);
    let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| builder.create_with_backend(backend)));
    match opened {
        Ok(Ok(db)) => Ok(db),
        Ok(Err(e)) => Err(classify_open(&path, e)),
        Err(panic) => {
            let detail = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "redb panicked while opening it".to_owned());
            Err(StoreError::Corrupted { path, detail })
        }
    }
}

/// The redb handle under a [`Shared`]: read-write for a [`DurableStore`], read-only (and pinned
/// to one commit) for a [`ReadOnlyStore`].
pub(crate) enum DbHandle {
    /// A writer's database.
    Rw(redb::Database),
    /// An inspection handle: every read uses the one transaction taken at open, so a whole
    /// command sees one commit. Declared before the database it reads, so it is dropped first.
    Ro {
        pinned: Arc<redb::ReadTransaction>,
        _db: redb::ReadOnlyDatabase,
    },
}

impl DbHandle {
    /// A read transaction at the latest commit (the pinned one for a read-only handle).
    pub(crate) fn begin_read(&self) -> Result<ReadTxn, redb::TransactionError> {
        use redb::ReadableDatabase as _;
        match self {
            Self::Rw(db) => db.begin_read().map(ReadTxn::Own),
            Self::Ro { pinned, .. } => Ok(ReadTxn::Pinned(pinned.clone())),
        }
    }

    /// A write transaction; a read-only handle has none (nothing in it writes).
    pub(crate) fn begin_write(&self) -> Result<redb::WriteTransaction, redb::TransactionError> {
        match self {
            Self::Rw(db) => db.begin_write(),
            Self::Ro { .. } => Err(redb::TransactionError::Storage(redb::StorageError::Io(
                std::io::Error::new(std::io::ErrorKind::PermissionDenied, "the database is open read-only"),
            ))),
        }
    }
}

/// A read transaction of its own, or the one a read-only handle is pinned to.
pub(crate) enum ReadTxn {
    Own(redb::ReadTransaction),
    Pinned(Arc<redb::ReadTransaction>),
}

impl std::ops::Deref for ReadTxn {
    type Target = redb::ReadTransaction;
    fn deref(&self) -> &redb::ReadTransaction {
        match self {
            Self::Own(t) => t,
            Self::Pinned(t) => t,
        }
    }
}

/// State shared by the writer and every read handle.
pub(crate) struct Shared {
    /// `None` once the store was closed: read handles that outlive it get [`StoreError::Closed`]
    /// instead of keeping the file (and its lock) open.
    db: std::sync::RwLock<Option<Arc<DbHandle>>>,
    pub(crate) path: PathBuf,
    pub(crate) indexes: IndexRegistry,
    /// Prepared zstd dictionaries for readers.
    pub(crate) dicts: dict::DictCache,
    /// How the database was opened: the writer reopens it the same way after an I/O error.
    config: StoreConfig,
    /// Stored rows the writer found damaged and went past (see
    /// [`DurableStore::damaged_rows_skipped`]).
    pub(crate) damaged_rows: std::sync::atomic::AtomicU64,
    /// The object caches' shared budget ([`StoreConfig::memory_budget`]).
    pub(crate) memory: Arc<MemoryBudget>,
    /// Lets the writer's periodic durable commit fsync in the background ([`fence`]).
    pub(crate) fence: Arc<fence::Fence>,
}

impl Shared {
    pub(crate) fn db(&self) -> Result<Arc<DbHandle>, StoreError> {
        self.db.reading().clone().ok_or_else(|| StoreError::Closed {
            path: self.path.clone(),
        })
    }

    fn take_db(&self) -> Option<Arc<DbHandle>> {
        self.db.writing().take()
    }

    /// Closes the database and opens it again (same file, same backend wrapper). redb refuses
    /// every operation after an I/O error ("Previous I/O error occurred") until it is reopened;
    /// the writer calls this once a commit failed with an I/O error. Read handles get
    /// [`StoreError::Closed`] while it runs (it waits up to 5 s for in-flight reads to finish,
    /// as the old database holds the file lock until its last reference is gone).
    pub(crate) fn reopen(&self) -> Result<(), StoreError> {
        if let Some(mut old) = self.take_db() {
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            loop {
                match Arc::try_unwrap(old) {
                    Ok(db) => {
                        drop(db);
                        break;
                    }
                    Err(still_shared) if std::time::Instant::now() < deadline => {
                        old = still_shared;
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(still_shared) => {
                        // A reader holds it for long: put it back and try again on the next error.
                        *self.db.writing() = Some(still_shared);
                        return Err(StoreError::Locked {
                            path: self.path.clone(),
                        });
                    }
                }
            }
        }
        // The old file is closed (its backend waited for any fsync in flight): a failure it
        // latched concerned that file only.
        self.fence.settle();
        self.fence.reset();
        let db = open_database(&self.config, &self.fence)?;
        *self.db.writing() = Some(Arc::new(DbHandle::Rw(db)));
        Ok(())
    }

    pub(crate) fn storage<E: Into<redb::Error>>(&self, e: E) -> StoreError {
        StoreError::Storage {
            path: self.path.clone(),
            source: e.into(),
        }
    }
}

/// An open database: the writer thread plus the factory for read handles.
///
/// The writer runs while the store or any [`Informer`](crate::informer::Informer) built on it
/// is alive: dropping the store while informers still run leaves their writes going, and the
/// last of them stops the writer when it is dropped. [`close`](Self::close) stops it at once,
/// after it committed everything queued (informers still running then report
/// [`StoreError::WriterGone`]).
///
/// Once the store and its informers are gone (dropped in any order, on any thread) or the store
/// is closed, [`open`](Self::open) of the same file in this process succeeds at once: it waits
/// for the file to be let go of (the writer's last commit, reads in flight). Another process
/// may find the file locked until then; the store alone, dropped or closed, lets go of it
/// before the drop or `close` returns, unless a read transaction of it (a `Snapshot`) is
/// still alive.
///
/// ```
/// use durable_informer::store::{DurableStore, StoreConfig};
/// # let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("db.redb");
/// let db = DurableStore::open(StoreConfig::new(&path))?;
/// drop(db);
/// let db = DurableStore::open(StoreConfig::new(&path))?;
/// db.close()?;
/// let _db = DurableStore::open(StoreConfig::new(&path))?;
/// # Ok::<(), durable_informer::store::StoreError>(())
/// ```
pub struct DurableStore {
    shared: Arc<Shared>,
    writer: Writer,
    life: Arc<Lifetime>,
}

/// Keeps a store's writer running: held by the [`DurableStore`] and by every informer built on
/// it, so that dropping the store first does not silently stop the informers' writes.
pub(crate) struct Lifetime {
    shared: Arc<Shared>,
    writer: Writer,
    thread: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Lifetime {
    /// Stops the writer after everything queued was committed, waits for it, and closes the
    /// file once in-flight reads finish (even if read handles remain).
    fn stop(&self) -> Result<(), StoreError> {
        use crate::util::Locked;
        self.shared.fence.closing.set();
        self.writer.shutdown();
        let thread = self.thread.locked().take();
        if let Some(t) = thread {
            t.join().map_err(|_| StoreError::WriterGone)?;
        }
        drop(self.shared.take_db());
        Ok(())
    }
}

impl Drop for Lifetime {
    fn drop(&mut self) {
        use crate::util::Locked;
        self.shared.fence.closing.set();
        // The last holder may be an informer dropped on an async task, which must not block
        // on the writer's last commit: the join then happens on a thread of its own (an open
        // of the file in this process waits for it, see `release`).
        if tokio::runtime::Handle::try_current().is_ok() {
            self.writer.shutdown();
            let thread = self.thread.locked().take();
            let shared = self.shared.clone();
            let closer = std::thread::Builder::new()
                .name("durable-informer-close".into())
                .spawn(move || {
                    if let Some(t) = thread {
                        let _ = t.join();
                    }
                    drop(shared.take_db());
                });
            if closer.is_ok() {
                return;
            }
        }
        let _ = self.stop();
    }
}

const REDB_MAGIC: [u8; 9] = [b'r', b'e', b'd', b'b', 0x1A, 0x0A, 0xA9, 0x0D, 0x0A];

impl DurableStore {
    /// Opens (or creates, with mode 0600) the database, migrates an older schema in one
    /// transaction, and starts the writer thread.
    ///
    /// This blocks (file I/O); from async code call it through `tokio::task::spawn_blocking`.
    /// A file that another open store holds is refused with [`StoreError::Locked`]; one that an
    /// earlier store of this process is still letting go of (it was closed or dropped a moment
    /// ago) is waited for, up to 10 seconds, so a restart within the process opens it at once.
    pub fn open(mut config: StoreConfig) -> Result<Self, StoreError> {
        if config.live_inspection && !config.durable {
            // redb refuses non-durable commits in a mode other processes read.
            return Err(StoreError::Config(
                "live_inspection(true) needs durable commits: durable(false) cannot be combined with it".into(),
            ));
        }
        if config.live_inspection {
            // Other processes see only durable commits: nothing may be deferred.
            config.fsync_delay = None;
        }
        let fence = Arc::new(fence::Fence::default());
        let db = match open_database(&config, &fence) {
            // An earlier store of this process may still be letting go of the file.
            Err(StoreError::Locked { .. }) if release::wait_released(&config.path, release::WAIT) => {
                open_database(&config, &fence)?
            }
            other => other?,
        };
        let path = config.path.clone();
        let shared = Arc::new(Shared {
            db: std::sync::RwLock::new(Some(Arc::new(DbHandle::Rw(db)))),
            fence,
            path,
            indexes: IndexRegistry::default(),
            dicts: dict::DictCache::default(),
            config: config.clone(),
            damaged_rows: std::sync::atomic::AtomicU64::new(0),
            memory: Arc::new(MemoryBudget::for_store(
                config.memory_budget,
                redb_cache_bytes(&config),
                config.path.clone(),
            )),
        });
        migrate::run(&shared)?;
        let (writer, thread) = writer::spawn(shared.clone(), &config)?;
        let life = Arc::new(Lifetime {
            shared: shared.clone(),
            writer: writer.clone(),
            thread: std::sync::Mutex::new(Some(thread)),
        });
        Ok(Self { shared, writer, life })
    }

    /// The handle through which every write goes. Cheap to clone.
    #[must_use]
    pub fn writer(&self) -> Writer {
        self.writer.clone()
    }

    /// What keeps the writer running, for an informer to hold.
    pub(crate) fn keepalive(&self) -> Arc<Lifetime> {
        self.life.clone()
    }

    /// A read handle over one scope.
    #[must_use]
    pub fn store(&self, scope: ScopeId) -> Store {
        Store::new(self.shared.clone(), scope)
    }

    /// The default object cache budget of this database's informers
    /// ([`StoreConfig::object_cache_bytes`]).
    #[must_use]
    pub fn object_cache_bytes(&self) -> usize {
        self.shared.config.object_cache_bytes
    }

    /// The store's memory budget ([`StoreConfig::memory_budget`]) and what is charged against
    /// it now, in bytes: `(used, budget)` (redb's page cache is charged from the start).
    ///
    /// ```
    /// # use durable_informer::store::{DurableStore, StoreConfig};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb")).memory_budget(64 << 20).cache_bytes(8 << 20)).unwrap();
    /// assert_eq!(db.memory_usage(), (8 << 20, 64 << 20));
    /// ```
    #[must_use]
    pub fn memory_usage(&self) -> (usize, usize) {
        (self.shared.memory.used(), self.shared.memory.limit())
    }

    /// The memory budget part by part: redb's page cache, the caches' always-held part and
    /// object JSON, the change stream and the list pages in flight, with their bounds and the
    /// peak of the total ([`StoreConfig::memory_budget`]).
    ///
    /// ```
    /// # use durable_informer::store::{DurableStore, StoreConfig};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb")).memory_budget(256 << 20)).unwrap();
    /// let stats = db.memory_stats();
    /// assert_eq!(stats.redb_cache, 16 << 20, "a thirty-second of the budget, at least 16 MiB");
    /// assert_eq!(stats.used(), db.memory_usage().0);
    /// assert!(!stats.exceeded);
    /// ```
    #[must_use]
    pub fn memory_stats(&self) -> MemoryStats {
        self.shared.memory.stats()
    }

    /// A reader of the delta log.
    #[must_use]
    pub fn log(&self) -> LogReader {
        LogReader::new(self.shared.clone())
    }

    /// Registers an index function for a scope in this process. Rows are maintained from now
    /// on; call [`Writer::ensure_index`] to backfill existing objects and record the index.
    pub fn register_index(&self, scope: ScopeId, indexer: Indexer) {
        self.shared.indexes.register(scope, indexer);
    }

    /// Verifies the invariants of the design (see [`CheckReport`]). Runs in one read
    /// transaction; blocking.
    pub fn check(&self) -> Result<CheckReport, StoreError> {
        check::run(&self.shared)
    }

    /// The database file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// How many damaged stored rows the writer went past since the store was opened: the
    /// stored version of an object that an update or delete replaced did not decode, so the
    /// change was written and logged with no previous state (handlers get `old` as `None`
    /// from the log). Each is also logged as an error; [`check`](Self::check) lists the rows
    /// still damaged.
    ///
    /// ```
    /// # use durable_informer::store::{DurableStore, StoreConfig};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let db = DurableStore::open(StoreConfig::new(dir.path().join("db.redb"))).unwrap();
    /// assert_eq!(db.damaged_rows_skipped(), 0);
    /// ```
    #[must_use]
    pub fn damaged_rows_skipped(&self) -> u64 {
        self.shared.damaged_rows.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Every scope in the database with its record.
    pub fn scopes(&self) -> Result<Vec<(ScopeId, ScopeRecord)>, StoreError> {
        read::scopes(&self.shared)
    }

    /// The stored cluster identity, if any.
    pub fn cluster_identity(&self) -> Result<Option<String>, StoreError> {
        read::meta_string(&self.shared, schema::META_CLUSTER_IDENTITY)
    }

    /// Every scope with its size and last use (see [`ScopeUsage`]). Reads the whole log once:
    /// proportional to the file.
    pub fn scope_usage(&self) -> Result<Vec<ScopeUsage>, StoreError> {
        inspect::scope_usage(&self.shared)
    }

    /// Stops the writer after everything queued was committed, waits for it, and closes the
    /// file (once reads in flight finished; a `Snapshot` still alive keeps it open until it is
    /// dropped). This blocks; from async code call it through `tokio::task::spawn_blocking`.
    pub fn close(mut self) -> Result<(), StoreError> {
        self.stop()
    }

    /// Closes the database and compacts the file (returns whether redb compacted anything).
    /// Every read handle must have been dropped; otherwise the file is closed uncompacted.
    pub fn close_and_compact(self) -> Result<bool, StoreError> {
        use crate::util::Locked;
        self.shared.fence.closing.set();
        self.writer.shutdown();
        let thread = self.life.thread.locked().take();
        if let Some(t) = thread {
            t.join().map_err(|_| StoreError::WriterGone)?;
        }
        let path = self.shared.path.clone();
        match self.shared.take_db().map(Arc::try_unwrap) {
            Some(Ok(DbHandle::Rw(mut db))) => db.compact().map_err(|e| StoreError::Storage { path, source: e.into() }),
            _ => Ok(false),
        }
    }

    fn stop(&mut self) -> Result<(), StoreError> {
        self.life.stop()
    }
}

impl From<&DurableStore> for LogReader {
    fn from(db: &DurableStore) -> Self {
        db.log()
    }
}

impl Drop for DurableStore {
    fn drop(&mut self) {
        // Alone, it closes the file before it returns (a reopen right after finds it free);
        // with informers still alive, the last of them stops the writer.
        if Arc::strong_count(&self.life) == 1 {
            let _ = self.stop();
        }
    }
}

fn classify_open(path: &Path, e: redb::DatabaseError) -> StoreError {
    match e {
        redb::DatabaseError::DatabaseAlreadyOpen | redb::DatabaseError::LockProtocolMismatch => {
            StoreError::Locked { path: path.to_owned() }
        }
        redb::DatabaseError::UpgradeRequired(v) => StoreError::Corrupted {
            path: path.to_owned(),
            detail: format!("redb file format {v} needs a manual upgrade"),
        },
        redb::DatabaseError::Storage(redb::StorageError::Corrupted(detail)) => StoreError::Corrupted {
            path: path.to_owned(),
            detail,
        },
        other => StoreError::Storage {
            path: path.to_owned(),
            source: other.into(),
        },
    }
}
