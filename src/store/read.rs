//! Read handles: [`Store`] over one scope's objects and indexes, [`Snapshot`] for several reads
//! at one point in time, and [`LogReader`] over the delta log.
//!
//! Every read runs in a redb read transaction (MVCC): it sees one committed state and is never
//! blocked by the writer. Reads are synchronous and short (microseconds per object), like
//! client-go's listers; a list of a very large scope is proportional to its size.

use std::sync::Arc;

use bytes::Bytes;
use redb::{ReadTransaction, ReadableDatabase, ReadableTable};
use serde::de::DeserializeOwned;

use super::codec::{self, DataRef, DeltaKind, ObjectHeader, PrevRef, ScopeRecord};
use super::dict::LoadDict;
use super::index::NAMESPACE;
use super::schema::{
    keys, CursorName, IndexName, IndexValue, ScopeId, Seq, CURSORS, DICTS, INDEX, INDEX_BACKFILL, LOG, META,
    META_LAST_SEQ, OBJECTS, SCOPES,
};
use super::{Shared, StoreError};
use crate::object::{ObjectError, ObjectKey, ObjectMeta, ResourceVersion};

/// One stored object: its key, metadata and JSON bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredObject {
    /// Its key.
    pub key: ObjectKey,
    /// Its metadata.
    pub meta: ObjectMeta,
    /// Its JSON bytes (as received, after the informer's transform).
    pub bytes: Bytes,
}

impl StoredObject {
    /// Decodes the JSON into `K` (for example `k8s_openapi::api::core::v1::Pod`).
    pub fn decode<K: DeserializeOwned>(&self) -> Result<K, StoreError> {
        serde_json::from_slice(&self.bytes).map_err(|e| StoreError::from(ObjectError::Json(e)))
    }
}

/// Reads the current bytes of an object row: from the row itself or from the log entry it
/// points at, decompressed (with its scope's dictionary when tagged so; `load` reads a
/// `dicts` row on a cache miss).
pub(crate) fn object_bytes<T: ReadableTable<u64, &'static [u8]>>(
    shared: &Shared,
    log: &T,
    header: &ObjectHeader,
    inline: &[u8],
    load: LoadDict<'_>,
) -> Result<Bytes, StoreError> {
    match header.data {
        DataRef::Inline => shared.dicts.unpack(header.compression, inline, load),
        DataRef::Log(seq) => {
            let Some(row) = log.get(seq).map_err(|e| shared.storage(e))? else {
                return Err(StoreError::Corrupted {
                    path: shared.path.clone(),
                    detail: format!("object {} points at missing log entry {seq}", header.meta.key()),
                });
            };
            let (h, data, _) = codec::decode_log(row.value())?;
            shared.dicts.unpack(h.compression, data, load)
        }
    }
}

/// Reads one `dicts` row through a table handle.
pub(crate) fn dict_row<T: ReadableTable<(u32, u32), &'static [u8]>>(
    shared: &Shared,
    table: &T,
    scope: u32,
    id: u32,
) -> Result<Option<Vec<u8>>, StoreError> {
    Ok(table
        .get((scope, id))
        .map_err(|e| shared.storage(e))?
        .map(|v| v.value().to_vec()))
}

/// The last seq ever handed out, as persisted with each commit (0 before the first).
fn saved_last_seq(s: &Shared, txn: &ReadTransaction) -> Result<u64, StoreError> {
    let meta = txn.open_table(META).map_err(|e| s.storage(e))?;
    Ok(match meta.get(META_LAST_SEQ).map_err(|e| s.storage(e))? {
        Some(v) => <[u8; 8]>::try_from(v.value()).map(u64::from_be_bytes).unwrap_or(0),
        None => 0,
    })
}

/// A `dicts` loader over a read transaction.
pub(crate) fn txn_loader<'a>(
    shared: &'a Shared,
    txn: &'a ReadTransaction,
) -> impl Fn(u32, u32) -> Result<Option<Vec<u8>>, StoreError> + 'a {
    move |scope, id| {
        let table = txn.open_table(DICTS).map_err(|e| shared.storage(e))?;
        dict_row(shared, &table, scope, id)
    }
}

/// Whether an index of a scope answers queries; see [`Snapshot::index_status`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IndexStatus {
    /// Its rows cover every object: queries answer.
    Ready,
    /// [`Writer::ensure_index`](super::Writer::ensure_index) added it to a scope that already
    /// held objects, and the backfill over them is still running (in bounded transactions,
    /// between batches). Queries return [`StoreError::IndexNotReady`] until it finished.
    Backfilling {
        /// The last object key backfilled so far (`None`: none yet). Objects written since
        /// the index was registered are indexed whatever their key.
        after: Option<ObjectKey>,
    },
    /// The scope has no such index.
    Absent,
}

/// A consistent view of the database at one commit.
pub struct Snapshot {
    shared: Arc<Shared>,
    txn: ReadTransaction,
    scope: ScopeId,
}

impl Snapshot {
    fn objects_in(&self, start: &[u8], end: &[u8]) -> Result<Vec<StoredObject>, StoreError> {
        self.objects_in_limited(start, end, usize::MAX)
    }

    fn objects_in_limited(&self, start: &[u8], end: &[u8], limit: usize) -> Result<Vec<StoredObject>, StoreError> {
        let s = &self.shared;
        let objects = self.txn.open_table(OBJECTS).map_err(|e| s.storage(e))?;
        let log = self.txn.open_table(LOG).map_err(|e| s.storage(e))?;
        let load = txn_loader(s, &self.txn);
        let mut out = Vec::new();
        for row in objects.range::<&[u8]>(start..end).map_err(|e| s.storage(e))? {
            if out.len() >= limit {
                break;
            }
            let (k, v) = row.map_err(|e| s.storage(e))?;
            let (h, inline) = codec::decode_object(v.value())?;
            let bytes = object_bytes(s, &log, &h, inline, &load)?;
            let (_, key) = keys::decode_object(k.value())?;
            out.push(StoredObject {
                key,
                meta: h.meta,
                bytes,
            });
        }
        Ok(out)
    }

    /// Visits the objects of a key range (every object of the scope, or one namespace) with
    /// their key and metadata; the visitor loads an object's JSON only if it needs it, so
    /// filtering on metadata and cache hits skip the log read and decompression.
    pub(crate) fn scan<T>(
        &self,
        namespace: Option<&str>,
        mut visit: impl FnMut(
            ObjectKey,
            &ObjectMeta,
            &mut dyn FnMut() -> Result<Bytes, StoreError>,
        ) -> Result<Option<T>, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        let (start, end) = match namespace {
            Some(ns) => keys::namespace_range(self.scope, ns),
            None => keys::scope_range(self.scope),
        };
        let s = &self.shared;
        let objects = self.txn.open_table(OBJECTS).map_err(|e| s.storage(e))?;
        let log = self.txn.open_table(LOG).map_err(|e| s.storage(e))?;
        let load = txn_loader(s, &self.txn);
        let mut out = Vec::new();
        for row in objects
            .range::<&[u8]>(start.as_slice()..end.as_slice())
            .map_err(|e| s.storage(e))?
        {
            let (k, v) = row.map_err(|e| s.storage(e))?;
            let (h, inline) = codec::decode_object(v.value())?;
            let (_, key) = keys::decode_object(k.value())?;
            let mut bytes = || object_bytes(s, &log, &h, inline, &load);
            if let Some(t) = visit(key, &h.meta, &mut bytes)? {
                out.push(t);
            }
        }
        Ok(out)
    }

    /// The object with this key.
    pub fn get(&self, key: &ObjectKey) -> Result<Option<StoredObject>, StoreError> {
        self.get_with(key, |meta, bytes| {
            Ok(StoredObject {
                key: key.clone(),
                meta: meta.clone(),
                bytes: bytes()?,
            })
        })
    }

    /// Like [`scan`](Self::scan) for one key: the visitor loads the JSON only if it needs it.
    pub(crate) fn get_with<T>(
        &self,
        key: &ObjectKey,
        visit: impl FnOnce(&ObjectMeta, &mut dyn FnMut() -> Result<Bytes, StoreError>) -> Result<T, StoreError>,
    ) -> Result<Option<T>, StoreError> {
        let s = &self.shared;
        let objects = self.txn.open_table(OBJECTS).map_err(|e| s.storage(e))?;
        let Some(v) = objects
            .get(keys::object(self.scope, key).as_slice())
            .map_err(|e| s.storage(e))?
        else {
            return Ok(None);
        };
        let (h, inline) = codec::decode_object(v.value())?;
        let log = self.txn.open_table(LOG).map_err(|e| s.storage(e))?;
        let load = txn_loader(s, &self.txn);
        let mut bytes = || object_bytes(s, &log, &h, inline, &load);
        visit(&h.meta, &mut bytes).map(Some)
    }

    /// Every object of the scope, in key order.
    pub fn list(&self) -> Result<Vec<StoredObject>, StoreError> {
        let (start, end) = keys::scope_range(self.scope);
        self.objects_in(&start, &end)
    }

    /// Up to `limit` objects after `after` (exclusive), in key order: pages through a large
    /// scope within one consistent view.
    pub fn list_after(&self, after: Option<&ObjectKey>, limit: usize) -> Result<Vec<StoredObject>, StoreError> {
        let (start, end) = keys::scope_range(self.scope);
        let start = match after {
            // The smallest key greater than `after`: its encoding plus one NUL byte.
            Some(k) => {
                let mut v = keys::object(self.scope, k);
                v.push(0);
                v
            }
            None => start,
        };
        self.objects_in_limited(&start, &end, limit)
    }

    /// The last log seq committed when this view was taken: every log entry up to it is
    /// reflected in the objects this view reads.
    pub fn position(&self) -> Result<Seq, StoreError> {
        let s = &self.shared;
        let saved = saved_last_seq(s, &self.txn)?;
        let log = self.txn.open_table(LOG).map_err(|e| s.storage(e))?;
        let in_log = log.last().map_err(|e| s.storage(e))?.map_or(0, |(k, _)| k.value());
        Ok(Seq(saved.max(in_log)))
    }

    /// Every object of one namespace (a key-range scan, no index rows).
    pub fn list_namespace(&self, namespace: &str) -> Result<Vec<StoredObject>, StoreError> {
        let (start, end) = keys::namespace_range(self.scope, namespace);
        self.objects_in(&start, &end)
    }

    /// Every key of the scope, in order.
    pub fn list_keys(&self) -> Result<Vec<ObjectKey>, StoreError> {
        let s = &self.shared;
        let objects = self.txn.open_table(OBJECTS).map_err(|e| s.storage(e))?;
        let (start, end) = keys::scope_range(self.scope);
        let mut out = Vec::new();
        for row in objects
            .range::<&[u8]>(start.as_slice()..end.as_slice())
            .map_err(|e| s.storage(e))?
        {
            let (k, _) = row.map_err(|e| s.storage(e))?;
            out.push(keys::decode_object(k.value())?.1);
        }
        Ok(out)
    }

    /// Number of objects in the scope.
    pub fn len(&self) -> Result<u64, StoreError> {
        Ok(self.record()?.object_count)
    }

    /// True when the scope holds no object.
    pub fn is_empty(&self) -> Result<bool, StoreError> {
        Ok(self.len()? == 0)
    }

    /// Keys of the objects indexed under `value` (the `namespace` index answers from key order).
    pub fn index_keys(&self, index: &str, value: &str) -> Result<Vec<ObjectKey>, StoreError> {
        if index == NAMESPACE {
            return Ok(self.list_namespace(value)?.into_iter().map(|o| o.key).collect());
        }
        let s = &self.shared;
        let name = IndexName(index.to_owned());
        self.require_index(&name)?;
        let table = self.txn.open_table(INDEX).map_err(|e| s.storage(e))?;
        let (start, end) = keys::index_value_range(self.scope, &name, &IndexValue(value.to_owned()));
        let mut out = Vec::new();
        for row in table
            .range::<&[u8]>(start.as_slice()..end.as_slice())
            .map_err(|e| s.storage(e))?
        {
            let (k, _) = row.map_err(|e| s.storage(e))?;
            out.push(keys::decode_index(k.value(), self.scope, &name)?.1);
        }
        Ok(out)
    }

    /// The objects indexed under `value`.
    pub fn by_index(&self, index: &str, value: &str) -> Result<Vec<StoredObject>, StoreError> {
        if index == NAMESPACE {
            return self.list_namespace(value);
        }
        let mut out = Vec::new();
        for key in self.index_keys(index, value)? {
            if let Some(o) = self.get(&key)? {
                out.push(o);
            }
        }
        Ok(out)
    }

    /// Every distinct value of an index, in order.
    pub fn list_index_values(&self, index: &str) -> Result<Vec<String>, StoreError> {
        let s = &self.shared;
        let name = IndexName(index.to_owned());
        self.require_index(&name)?;
        let table = self.txn.open_table(INDEX).map_err(|e| s.storage(e))?;
        let (start, end) = keys::index_range(self.scope, &name);
        let mut out: Vec<String> = Vec::new();
        for row in table
            .range::<&[u8]>(start.as_slice()..end.as_slice())
            .map_err(|e| s.storage(e))?
        {
            let (k, _) = row.map_err(|e| s.storage(e))?;
            let (v, _) = keys::decode_index(k.value(), self.scope, &name)?;
            if out.last() != Some(&v.0) {
                out.push(v.0);
            }
        }
        Ok(out)
    }

    /// Whether an index answers queries in this view: ready, still being backfilled over the
    /// objects the scope held when it was added, or absent.
    ///
    /// ```no_run
    /// use durable_informer::object::ScopeSpec;
    /// use durable_informer::store::{DurableStore, IndexStatus, StoreConfig};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let db = DurableStore::open(StoreConfig::new("/tmp/cache.redb"))?;
    /// let scope = db.writer().register_scope_blocking(&ScopeSpec::new("", "v1", "pods"))?;
    /// match db.store(scope).snapshot()?.index_status("labels")? {
    ///     IndexStatus::Ready => println!("queries answer from every object"),
    ///     IndexStatus::Backfilling { after } => println!("indexed up to {after:?} so far"),
    ///     IndexStatus::Absent => println!("call ensure_index first"),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn index_status(&self, index: &str) -> Result<IndexStatus, StoreError> {
        if self.record()?.indexes.iter().any(|n| n == index) {
            return Ok(IndexStatus::Ready);
        }
        let s = &self.shared;
        let table = self.txn.open_table(INDEX_BACKFILL).map_err(|e| s.storage(e))?;
        let row = table.get((self.scope.0, index)).map_err(|e| s.storage(e))?;
        match row {
            Some(v) => Ok(IndexStatus::Backfilling {
                after: codec::decode_backfill(v.value())?.after,
            }),
            None => Ok(IndexStatus::Absent),
        }
    }

    fn require_index(&self, name: &IndexName) -> Result<(), StoreError> {
        // A backfilling index holds rows for part of the scope only: refuse rather than answer
        // partially.
        match self.index_status(&name.0)? {
            IndexStatus::Ready => Ok(()),
            IndexStatus::Backfilling { .. } => Err(StoreError::IndexNotReady {
                scope: self.scope,
                name: name.0.clone(),
            }),
            IndexStatus::Absent => Err(StoreError::UnknownIndex {
                scope: self.scope,
                name: name.0.clone(),
            }),
        }
    }

    /// The scope's persisted record (RV, synced flag, counts).
    pub fn record(&self) -> Result<ScopeRecord, StoreError> {
        let s = &self.shared;
        let scopes = self.txn.open_table(SCOPES).map_err(|e| s.storage(e))?;
        let Some(v) = scopes.get(self.scope.0).map_err(|e| s.storage(e))? else {
            return Err(StoreError::UnknownScope(self.scope));
        };
        Ok(codec::decode_scope(v.value())?)
    }
}

/// A cheap, cloneable read handle over one scope.
#[derive(Clone)]
pub struct Store {
    shared: Arc<Shared>,
    scope: ScopeId,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

impl Store {
    pub(crate) fn new(shared: Arc<Shared>, scope: ScopeId) -> Self {
        Self { shared, scope }
    }

    /// The scope this handle reads.
    #[must_use]
    pub fn scope(&self) -> ScopeId {
        self.scope
    }

    /// A view at the latest commit, for several consistent reads.
    pub fn snapshot(&self) -> Result<Snapshot, StoreError> {
        let txn = self.shared.db()?.begin_read().map_err(|e| self.shared.storage(e))?;
        Ok(Snapshot {
            shared: self.shared.clone(),
            txn,
            scope: self.scope,
        })
    }

    /// See [`Snapshot::get`].
    pub fn get(&self, key: &ObjectKey) -> Result<Option<StoredObject>, StoreError> {
        self.snapshot()?.get(key)
    }

    /// The object with this key, decoded into `K`.
    pub fn get_as<K: DeserializeOwned>(&self, key: &ObjectKey) -> Result<Option<K>, StoreError> {
        self.get(key)?.map(|o| o.decode()).transpose()
    }

    /// See [`Snapshot::list`].
    pub fn list(&self) -> Result<Vec<StoredObject>, StoreError> {
        self.snapshot()?.list()
    }

    /// See [`Snapshot::get_with`].
    pub(crate) fn get_with<T>(
        &self,
        key: &ObjectKey,
        visit: impl FnOnce(&ObjectMeta, &mut dyn FnMut() -> Result<Bytes, StoreError>) -> Result<T, StoreError>,
    ) -> Result<Option<T>, StoreError> {
        self.snapshot()?.get_with(key, visit)
    }

    /// See [`Snapshot::scan`].
    pub(crate) fn scan<T>(
        &self,
        namespace: Option<&str>,
        visit: impl FnMut(
            ObjectKey,
            &ObjectMeta,
            &mut dyn FnMut() -> Result<Bytes, StoreError>,
        ) -> Result<Option<T>, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        self.snapshot()?.scan(namespace, visit)
    }

    /// See [`Snapshot::list_namespace`].
    pub fn list_namespace(&self, namespace: &str) -> Result<Vec<StoredObject>, StoreError> {
        self.snapshot()?.list_namespace(namespace)
    }

    /// See [`Snapshot::list_keys`].
    pub fn list_keys(&self) -> Result<Vec<ObjectKey>, StoreError> {
        self.snapshot()?.list_keys()
    }

    /// See [`Snapshot::by_index`].
    pub fn by_index(&self, index: &str, value: &str) -> Result<Vec<StoredObject>, StoreError> {
        self.snapshot()?.by_index(index, value)
    }

    /// See [`Snapshot::index_keys`].
    pub fn index_keys(&self, index: &str, value: &str) -> Result<Vec<ObjectKey>, StoreError> {
        self.snapshot()?.index_keys(index, value)
    }

    /// See [`Snapshot::list_index_values`].
    pub fn list_index_values(&self, index: &str) -> Result<Vec<String>, StoreError> {
        self.snapshot()?.list_index_values(index)
    }

    /// See [`Snapshot::index_status`].
    pub fn index_status(&self, index: &str) -> Result<IndexStatus, StoreError> {
        self.snapshot()?.index_status(index)
    }

    /// See [`Snapshot::record`].
    pub fn record(&self) -> Result<ScopeRecord, StoreError> {
        self.snapshot()?.record()
    }

    /// The persisted resourceVersion of the scope.
    pub fn resource_version(&self) -> Result<Option<ResourceVersion>, StoreError> {
        Ok(self.record()?.rv)
    }
}

/// One entry of the delta log, with the bytes a handler needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRecord {
    /// Its seq.
    pub seq: Seq,
    /// Its scope.
    pub scope: ScopeId,
    /// What happened (`Added`, `Updated`, `Deleted` or `Sync`).
    pub kind: DeltaKind,
    /// The object's key.
    pub key: ObjectKey,
    /// The RV of this version (of the deletion, for deletes with a known final state).
    pub rv: ResourceVersion,
    /// The new state (for deletes: the final state, when known).
    pub object: Option<Bytes>,
    /// The previous state (updates and deletes), while it is retained.
    pub old: Option<Bytes>,
    /// A delete found by a relist: `object` is `None` and `old` is the last known state.
    pub final_state_unknown: bool,
}

/// A reader of the delta log.
#[derive(Clone)]
pub struct LogReader {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for LogReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogReader").finish_non_exhaustive()
    }
}

impl LogReader {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// Up to `limit` entries with seq greater than `after`, in order; only those of `scope` when
    /// given.
    pub fn read_after(&self, after: Seq, limit: usize, scope: Option<ScopeId>) -> Result<Vec<LogRecord>, StoreError> {
        let s = &self.shared;
        let txn = s.db()?.begin_read().map_err(|e| s.storage(e))?;
        let log = txn.open_table(LOG).map_err(|e| s.storage(e))?;
        let load = txn_loader(s, &txn);
        let mut out = Vec::new();
        for row in log.range(after.0.saturating_add(1)..).map_err(|e| s.storage(e))? {
            if out.len() >= limit {
                break;
            }
            let (k, v) = row.map_err(|e| s.storage(e))?;
            if let Some(r) = decode_record(s, &log, k.value(), v.value(), scope, &load)? {
                out.push(r);
            }
        }
        Ok(out)
    }

    /// Like [`read_after`](Self::read_after) for one scope, and also says how far it looked:
    /// a consumer of one scope advances its cursor past other scopes' entries too.
    pub fn read_scope_after(
        &self,
        after: Seq,
        limit: usize,
        scope: ScopeId,
    ) -> Result<(Vec<LogRecord>, Seq), StoreError> {
        let s = &self.shared;
        let txn = s.db()?.begin_read().map_err(|e| s.storage(e))?;
        self.scope_after_in(&txn, after, limit, scope)
    }

    fn scope_after_in(
        &self,
        txn: &ReadTransaction,
        after: Seq,
        limit: usize,
        scope: ScopeId,
    ) -> Result<(Vec<LogRecord>, Seq), StoreError> {
        let s = &self.shared;
        let log = txn.open_table(LOG).map_err(|e| s.storage(e))?;
        let load = txn_loader(s, txn);
        let mut scanned = after;
        let mut out = Vec::new();
        for row in log.range(after.0.saturating_add(1)..).map_err(|e| s.storage(e))? {
            if out.len() >= limit {
                break;
            }
            let (k, v) = row.map_err(|e| s.storage(e))?;
            scanned = Seq(k.value());
            if let Some(r) = decode_record(s, &log, k.value(), v.value(), Some(scope), &load)? {
                out.push(r);
            }
        }
        Ok((out, scanned))
    }

    /// Like [`read_scope_after`](Self::read_scope_after), but fails with
    /// [`StoreError::LogCompacted`] when entries right after `after` were already compacted, so
    /// a consumer never skips them silently. The check and the read share one view.
    pub fn read_scope_after_contiguous(
        &self,
        after: Seq,
        limit: usize,
        scope: ScopeId,
    ) -> Result<(Vec<LogRecord>, Seq), StoreError> {
        let s = &self.shared;
        let txn = s.db()?.begin_read().map_err(|e| s.storage(e))?;
        let log = txn.open_table(LOG).map_err(|e| s.storage(e))?;
        // Seqs are dense and never reused (invariant 4), so a first entry beyond `after + 1`
        // (or an empty log whose last handed-out seq is beyond `after`) means compaction.
        let first = match log.first().map_err(|e| s.storage(e))? {
            Some((k, _)) => k.value(),
            None => saved_last_seq(s, &txn)?.saturating_add(1),
        };
        if first > after.0.saturating_add(1) {
            return Err(StoreError::LogCompacted {
                after: after.0,
                first_retained: first,
            });
        }
        drop(log);
        self.scope_after_in(&txn, after, limit, scope)
    }

    /// The first and last seq in the log (`None` when empty).
    pub fn bounds(&self) -> Result<Option<(Seq, Seq)>, StoreError> {
        let s = &self.shared;
        let txn = s.db()?.begin_read().map_err(|e| s.storage(e))?;
        let log = txn.open_table(LOG).map_err(|e| s.storage(e))?;
        let first = log.first().map_err(|e| s.storage(e))?.map(|(k, _)| k.value());
        let last = log.last().map_err(|e| s.storage(e))?.map(|(k, _)| k.value());
        Ok(first.zip(last).map(|(a, b)| (Seq(a), Seq(b))))
    }

    /// The cursor of the durable consumer `name` of `scope`.
    pub fn cursor(&self, scope: ScopeId, name: impl Into<CursorName>) -> Result<Option<Seq>, StoreError> {
        let name = name.into();
        let s = &self.shared;
        let txn = s.db()?.begin_read().map_err(|e| s.storage(e))?;
        let cursors = txn.open_table(CURSORS).map_err(|e| s.storage(e))?;
        Ok(cursors
            .get((scope.0, name.as_str()))
            .map_err(|e| s.storage(e))?
            .map(|v| Seq(v.value())))
    }
}

/// Decodes one log row into a record with the bytes a handler needs (`None` when it belongs to
/// another scope than `scope`).
fn decode_record<T: ReadableTable<u64, &'static [u8]>>(
    s: &Shared,
    log: &T,
    seq: u64,
    value: &[u8],
    scope: Option<ScopeId>,
    load: LoadDict<'_>,
) -> Result<Option<LogRecord>, StoreError> {
    let unpack = |c, b: &[u8]| s.dicts.unpack(c, b, load);
    let (h, data, prev_inline) = codec::decode_log(value)?;
    if scope.is_some_and(|sc| sc.0 != h.scope) {
        return Ok(None);
    }
    let object = if h.has_data {
        Some(unpack(h.compression, data)?)
    } else {
        None
    };
    let old = match h.prev {
        PrevRef::None => None,
        PrevRef::Inline(c) => Some(unpack(c, prev_inline)?),
        PrevRef::Log(p) => match log.get(p).map_err(|e| s.storage(e))? {
            Some(row) => {
                let (ph, pdata, _) = codec::decode_log(row.value())?;
                ph.has_data.then(|| unpack(ph.compression, pdata)).transpose()?
            }
            None => None,
        },
    };
    let (object, old) = match h.kind {
        // A sync carries no bytes: its state is the previous (= current) one.
        DeltaKind::Sync => (old.clone(), old),
        _ => (object, old),
    };
    Ok(Some(LogRecord {
        seq: Seq(seq),
        scope: ScopeId(h.scope),
        kind: h.kind,
        key: h.key,
        rv: h.rv,
        object,
        old,
        final_state_unknown: h.final_state_unknown,
    }))
}

pub(crate) fn scopes(shared: &Shared) -> Result<Vec<(ScopeId, ScopeRecord)>, StoreError> {
    let txn = shared.db()?.begin_read().map_err(|e| shared.storage(e))?;
    let table = txn.open_table(SCOPES).map_err(|e| shared.storage(e))?;
    let mut out = Vec::new();
    for row in table.iter().map_err(|e| shared.storage(e))? {
        let (k, v) = row.map_err(|e| shared.storage(e))?;
        out.push((ScopeId(k.value()), codec::decode_scope(v.value())?));
    }
    Ok(out)
}

pub(crate) fn meta_string(shared: &Shared, key: &str) -> Result<Option<String>, StoreError> {
    let txn = shared.db()?.begin_read().map_err(|e| shared.storage(e))?;
    let table = txn.open_table(META).map_err(|e| shared.storage(e))?;
    let v = table.get(key).map_err(|e| shared.storage(e))?;
    Ok(v.map(|v| String::from_utf8_lossy(v.value()).into_owned()))
}
