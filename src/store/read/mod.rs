//! Read handles: [`Store`] over one scope's objects and indexes, [`Snapshot`] for several reads
//! at one point in time, and [`LogReader`] over the delta log.
//!
//! Every read runs in a redb read transaction (MVCC): it sees one committed state and is never
//! blocked by the writer. Reads are synchronous and short (microseconds per object), like
//! client-go's listers; a list of a very large scope is proportional to its size.

mod handle;
mod log;
mod snapshot;

pub use handle::Store;
pub(crate) use log::{DamagedEntry, LogEntry};
pub use log::{LogReader, LogRecord};
pub(crate) use snapshot::ObjectEntry;
pub use snapshot::{IndexStatus, Snapshot};

use bytes::Bytes;
use redb::{ReadTransaction, ReadableTable};
use serde::de::DeserializeOwned;

use super::codec::{self, DataRef, ObjectHeader, ScopeRecord};
use super::dict::LoadDict;
use super::schema::{ScopeId, DICTS, META, META_LAST_SEQ, SCOPES};
use super::{Shared, StoreError};
use crate::object::{ObjectError, ObjectKey, ObjectMeta};

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
