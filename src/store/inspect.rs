//! [`ReadOnlyStore`]: a read-only view of a database, one commit of it, alongside the process
//! that writes it.
//!
//! The writing process opens the file in redb's single-writer mode (one writer, any number of
//! read-only handles in other processes, coordinated by byte-range locks), so a second process
//! can read while a controller runs. A read-only handle opens the file read-only, takes one
//! read transaction at open and answers every read from it: what it shows is the state at one
//! commit, and it can neither write, migrate nor recover the file.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::codec::ScopeRecord;
use super::read::{self, LogReader, Store};
use super::schema::{self, ScopeId};
use super::{check, classify_open, dict, migrate, CheckReport, DbHandle, Shared, StoreConfig, StoreError};
use crate::util::RwLocked;

/// redb's page cache of a read-only handle: it reads each page about once.
const CACHE_BYTES: usize = 64 << 20;

/// A read-only view of a database at one commit: the commit current when it was opened.
///
/// It may be opened while a [`DurableStore`](super::DurableStore) in another process writes the
/// file, when that store was opened with
/// [`live_inspection(true)`](super::StoreConfig::live_inspection) (otherwise the writer holds
/// the file exclusively: [`StoreError::Locked`]); it never changes the file (no migration, no recovery, no write of any kind), and its
/// reads all come from one read transaction. A database of another schema version is refused
/// ([`StoreError::OlderSchema`], [`StoreError::NewerSchema`]), a file left unclean with no live
/// writer too ([`StoreError::NeedsRecovery`]). The writer cannot reuse the pages of that commit
/// while the handle is open, so keep it for the duration of one inspection, and open a new one
/// to see later commits.
///
/// ```
/// use durable_informer::object::ScopeSpec;
/// use durable_informer::store::{DurableStore, ReadOnlyStore, StoreConfig};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let path = dir.path().join("cache.redb");
/// let db = DurableStore::open(StoreConfig::new(&path).live_inspection(true))?;
/// db.writer().register_scope_blocking(&ScopeSpec::new("", "v1", "configmaps"))?;
/// // The writer is still open: a read-only handle reads beside it.
/// let view = ReadOnlyStore::open(&path)?;
/// assert_eq!(view.scopes()?.len(), 1);
/// # Ok(()) }
/// ```
pub struct ReadOnlyStore {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ReadOnlyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadOnlyStore")
            .field("path", &self.shared.path)
            .finish_non_exhaustive()
    }
}

impl ReadOnlyStore {
    /// Opens the database at `path` read-only, at its latest commit. Blocking (file I/O).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref().to_owned();
        let handle = open_read_only(&path)?;
        let shared = Arc::new(Shared {
            db: std::sync::RwLock::new(Some(Arc::new(handle))),
            path: path.clone(),
            indexes: super::index::IndexRegistry::default(),
            dicts: dict::DictCache::default(),
            config: StoreConfig::new(&path),
            damaged_rows: std::sync::atomic::AtomicU64::new(0),
            memory: Arc::new(super::MemoryBudget::new(usize::MAX)),
            fence: Arc::default(),
        });
        let found = migrate::read_version(&shared)?;
        let supported = migrate::LATEST;
        if found > supported {
            return Err(StoreError::NewerSchema { path, found, supported });
        }
        if found < supported {
            return Err(StoreError::OlderSchema { path, found, supported });
        }
        Ok(Self { shared })
    }

    /// A read handle over one scope.
    #[must_use]
    pub fn store(&self, scope: ScopeId) -> Store {
        Store::new(self.shared.clone(), scope)
    }

    /// A reader of the delta log.
    #[must_use]
    pub fn log(&self) -> LogReader {
        LogReader::new(self.shared.clone())
    }

    /// Every scope in the database with its record.
    pub fn scopes(&self) -> Result<Vec<(ScopeId, ScopeRecord)>, StoreError> {
        read::scopes(&self.shared)
    }

    /// Every scope with its size and last use (see [`ScopeUsage`]).
    pub fn scope_usage(&self) -> Result<Vec<ScopeUsage>, StoreError> {
        scope_usage(&self.shared)
    }

    /// The stored cluster identity, if any.
    pub fn cluster_identity(&self) -> Result<Option<String>, StoreError> {
        read::meta_string(&self.shared, schema::META_CLUSTER_IDENTITY)
    }

    /// Verifies the invariants of the design (see [`CheckReport`]) at this handle's commit.
    pub fn check(&self) -> Result<CheckReport, StoreError> {
        check::run(&self.shared)
    }

    /// The database file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.shared.path
    }
}

impl From<&ReadOnlyStore> for LogReader {
    fn from(db: &ReadOnlyStore) -> Self {
        db.log()
    }
}

impl Drop for ReadOnlyStore {
    fn drop(&mut self) {
        // Releases the file's locks now, even if a Store handle of it is still alive (it then
        // gets `StoreError::Closed`), so a forgotten handle does not pin the writer's pages.
        drop(self.shared.db.writing().take());
    }
}

/// Opens the file read-only (the descriptor too) and pins a read transaction.
fn open_read_only(path: &PathBuf) -> Result<DbHandle, StoreError> {
    let io = |source| StoreError::Io {
        path: path.clone(),
        source,
    };
    let mut file = File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    let mut magic = [0u8; 9];
    if (len as usize) < magic.len() || file.read_exact(&mut magic).is_err() || magic != super::REDB_MAGIC {
        return Err(StoreError::NotADatabase { path: path.clone() });
    }
    let backend = redb::backends::FileBackend::new(file).map_err(|e| classify_open(path, e))?;
    let mut builder = redb::Builder::new();
    builder.set_cache_size(CACHE_BYTES);
    builder.set_concurrency_mode(super::concurrency(true));
    // As in the writer's open: a damaged file gives an error naming it, not a panic.
    let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        builder.open_read_only_with_backend(backend)
    }));
    let db = match opened {
        Ok(Ok(db)) => db,
        Ok(Err(redb::DatabaseError::RepairAborted)) => return Err(StoreError::NeedsRecovery { path: path.clone() }),
        Ok(Err(e)) => return Err(classify_open(path, e)),
        Err(_) => {
            return Err(StoreError::Corrupted {
                path: path.clone(),
                detail: "redb panicked while opening it".into(),
            })
        }
    };
    let pinned = {
        use redb::ReadableDatabase as _;
        db.begin_read().map_err(|e| StoreError::Storage {
            path: path.clone(),
            source: e.into(),
        })?
    };
    Ok(DbHandle::Ro {
        pinned: Arc::new(pinned),
        _db: db,
    })
}

/// One scope's footprint and last use: what `durable-informer scopes` prints.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ScopeUsage {
    /// The scope.
    pub scope: ScopeId,
    /// Its record (spec, objects, resourceVersion, relists).
    pub record: ScopeRecord,
    /// Its spec, parsed (`None` if the record's spec is not in the canonical form).
    pub spec: Option<crate::object::ScopeSpec>,
    /// When a process last had it registered (unix milliseconds); `None` when never recorded
    /// (a file written before use was recorded).
    pub last_used_ms: Option<u64>,
    /// Bytes of its object rows (keys and values; an object whose current version is in a
    /// retained log entry counts that entry in `log_bytes` instead).
    pub object_bytes: u64,
    /// Its retained log entries.
    pub log_entries: u64,
    /// Bytes of those entries.
    pub log_bytes: u64,
}

/// Every scope's [`ScopeUsage`], in one read transaction: the scopes, their objects and the
/// whole log once.
pub(crate) fn scope_usage(shared: &Shared) -> Result<Vec<ScopeUsage>, StoreError> {
    use redb::ReadableTable;
    let st = |e: redb::Error| shared.storage(e);
    let txn = shared.db()?.begin_read().map_err(|e| shared.storage(e))?;
    let mut out: std::collections::BTreeMap<u32, ScopeUsage> = std::collections::BTreeMap::new();
    let used = match txn.open_table(schema::SCOPE_USE) {
        Ok(t) => Some(t),
        Err(redb::TableError::TableDoesNotExist(_)) => None,
        Err(e) => return Err(st(e.into())),
    };
    let scopes = txn.open_table(schema::SCOPES).map_err(|e| st(e.into()))?;
    for row in scopes.iter().map_err(|e| st(e.into()))? {
        let (k, v) = row.map_err(|e| st(e.into()))?;
        let id = k.value();
        let record = super::codec::decode_scope(v.value())?;
        let last_used_ms = match &used {
            Some(t) => t.get(id).map_err(|e| st(e.into()))?.map(|v| v.value()),
            None => None,
        };
        out.insert(
            id,
            ScopeUsage {
                scope: ScopeId(id),
                spec: crate::object::ScopeSpec::from_canonical(&record.spec),
                record,
                last_used_ms,
                object_bytes: 0,
                log_entries: 0,
                log_bytes: 0,
            },
        );
    }
    let objects = txn.open_table(schema::OBJECTS).map_err(|e| st(e.into()))?;
    for u in out.values_mut() {
        let (start, end) = schema::keys::scope_range(u.scope);
        for row in objects
            .range::<&[u8]>(start.as_slice()..end.as_slice())
            .map_err(|e| st(e.into()))?
        {
            let (k, v) = row.map_err(|e| st(e.into()))?;
            u.object_bytes += (k.value().len() + v.value().len()) as u64;
        }
    }
    let log = txn.open_table(schema::LOG).map_err(|e| st(e.into()))?;
    for row in log.iter().map_err(|e| st(e.into()))? {
        let (_, v) = row.map_err(|e| st(e.into()))?;
        let (h, _, _) = super::codec::decode_log(v.value())?;
        if let Some(u) = out.get_mut(&h.scope) {
            u.log_entries += 1;
            u.log_bytes += v.value().len() as u64;
        }
    }
    Ok(out.into_values().collect())
}
