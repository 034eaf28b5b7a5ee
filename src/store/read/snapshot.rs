//! [`Snapshot`]: several reads of one scope at one committed state, and index status.

use std::sync::Arc;

use bytes::Bytes;
use redb::ReadableTable;

use super::super::ReadTxn;

use super::super::codec::{self, DataRef, ScopeRecord, ShardRecord};
use super::super::index::NAMESPACE;
use super::super::schema::{
    keys, IndexName, IndexValue, ScopeId, Seq, INDEX, INDEX_BACKFILL, LOG, OBJECTS, SCOPES, SHARDS,
};
use super::super::{Shared, StoreError};
use crate::object::{ObjectKey, ObjectMeta};

use super::{object_bytes, saved_last_seq, txn_loader, StoredObject};

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

/// What a tolerant read of the objects found in one row: an object, or a row that does not
/// decode.
#[derive(Debug)]
pub(crate) enum ObjectEntry {
    /// A row that decoded.
    Object(StoredObject),
    /// A damaged row: its key (`None` when that does not decode either) and why.
    Damaged { key: Option<ObjectKey>, error: StoreError },
}

/// A consistent view of the database at one commit.
pub struct Snapshot {
    pub(super) shared: Arc<Shared>,
    pub(super) txn: ReadTxn,
    pub(super) scope: ScopeId,
}

impl Snapshot {
    /// A view over an open read transaction.
    pub(crate) fn from_txn(shared: Arc<Shared>, txn: ReadTxn, scope: ScopeId) -> Self {
        Self { shared, txn, scope }
    }

    /// Every (value, key) row of one index, in order.
    pub(crate) fn index_rows(&self, name: &IndexName) -> Result<Vec<(IndexValue, ObjectKey)>, StoreError> {
        let s = &self.shared;
        let table = self.txn.open_table(INDEX).map_err(|e| s.storage(e))?;
        let (start, end) = keys::index_range(self.scope, name);
        let mut out = Vec::new();
        for row in table
            .range::<&[u8]>(start.as_slice()..end.as_slice())
            .map_err(|e| s.storage(e))?
        {
            let (k, _) = row.map_err(|e| s.storage(e))?;
            out.push(keys::decode_index(k.value(), self.scope, name)?);
        }
        Ok(out)
    }

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
        self.scan_versions(namespace, |key, meta, _, bytes| visit(key, meta, bytes))
    }

    /// [`scan`](Self::scan), also giving each object's version its place in the log: the seq of
    /// the entry that holds its bytes (`Seq(0)` once that entry was compacted), so a reader can
    /// find that version again by seq, and check it there by key and resourceVersion.
    pub(crate) fn scan_versions<T>(
        &self,
        namespace: Option<&str>,
        mut visit: impl FnMut(
            ObjectKey,
            &ObjectMeta,
            Seq,
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
            let seq = match h.data {
                DataRef::Log(seq) => Seq(seq),
                DataRef::Inline => Seq(0),
            };
            let mut bytes = || object_bytes(s, &log, &h, inline, &load);
            if let Some(t) = visit(key, &h.meta, seq, &mut bytes)? {
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
        let (start, end) = self.range_after(after);
        self.objects_in_limited(&start, &end, limit)
    }

    /// Like [`list_after`](Self::list_after), with damaged rows in their place instead of
    /// an error (only a storage error fails), and paged by the rows' encoded keys, so that a
    /// row whose key itself does not decode is stepped over too: what synthetic adds and
    /// resyncs read, so that one damaged row does not stop them for ever. Returns the rows and
    /// the encoded key of the last one (where the next page starts after; `None`: no row).
    /// Each damaged row is counted (`durable_informer_damaged_rows_skipped_total`).
    pub(crate) fn list_entries_after(
        &self,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<(Vec<ObjectEntry>, Option<Vec<u8>>), StoreError> {
        let s = &self.shared;
        let (scope_start, end) = keys::scope_range(self.scope);
        let start = match after {
            // The smallest encoded key greater than `after`.
            Some(k) => {
                let mut v = k.to_vec();
                v.push(0);
                v
            }
            None => scope_start,
        };
        let objects = self.txn.open_table(OBJECTS).map_err(|e| s.storage(e))?;
        let log = self.txn.open_table(LOG).map_err(|e| s.storage(e))?;
        let load = txn_loader(s, &self.txn);
        let (mut out, mut last) = (Vec::new(), None);
        for row in objects
            .range::<&[u8]>(start.as_slice()..end.as_slice())
            .map_err(|e| s.storage(e))?
        {
            if out.len() >= limit {
                break;
            }
            let (k, v) = row.map_err(|e| s.storage(e))?;
            let raw = k.value();
            last = Some(raw.to_vec());
            let key = keys::decode_object(raw).map(|(_, key)| key);
            let decoded = key.clone().map_err(StoreError::from).and_then(|key| {
                let (h, inline) = codec::decode_object(v.value())?;
                let bytes = object_bytes(s, &log, &h, inline, &load)?;
                Ok(StoredObject {
                    key,
                    meta: h.meta,
                    bytes,
                })
            });
            out.push(match decoded {
                Ok(o) => ObjectEntry::Object(o),
                Err(error) => {
                    crate::store::metrics::damaged_row_skipped(&s.path);
                    ObjectEntry::Damaged { key: key.ok(), error }
                }
            });
        }
        Ok((out, last))
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
        self.list_keys_after(None, usize::MAX)
    }

    /// Up to `limit` keys after `after` (exclusive), in order: pages through the keys of a
    /// large scope within one consistent view, reading no object.
    pub fn list_keys_after(&self, after: Option<&ObjectKey>, limit: usize) -> Result<Vec<ObjectKey>, StoreError> {
        let s = &self.shared;
        let objects = self.txn.open_table(OBJECTS).map_err(|e| s.storage(e))?;
        let (start, end) = self.range_after(after);
        let mut out = Vec::new();
        for row in objects
            .range::<&[u8]>(start.as_slice()..end.as_slice())
            .map_err(|e| s.storage(e))?
            .take(limit)
        {
            let (k, _) = row.map_err(|e| s.storage(e))?;
            out.push(keys::decode_object(k.value())?.1);
        }
        Ok(out)
    }

    /// The scope's key range, starting after `after` when given.
    fn range_after(&self, after: Option<&ObjectKey>) -> (Vec<u8>, Vec<u8>) {
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
        (start, end)
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

    /// The scope's shard: its hash range and the added ranges not fetched yet (the default,
    /// no range, for a scope that holds every object).
    pub fn shard(&self) -> Result<ShardRecord, StoreError> {
        let s = &self.shared;
        let shards = match self.txn.open_table(SHARDS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(ShardRecord::default()),
            Err(e) => return Err(s.storage(e)),
        };
        match shards.get(self.scope.0).map_err(|e| s.storage(e))? {
            Some(v) => Ok(codec::decode_shard(v.value())?),
            None => Ok(ShardRecord::default()),
        }
    }
}
