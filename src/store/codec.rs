//! The stored encoding: the only module that uses bincode.
//!
//! Every stored value is a *versioned envelope*: one version byte, a little-endian `u32` header
//! length, a bincode header, then (for rows that carry object bytes) the object's bytes as they
//! arrived, so reading the bytes back is a slice, not a decode.

use serde::{Deserialize, Serialize};

use crate::object::{ObjectError, ObjectKey, ObjectMeta, ResourceVersion};
use crate::selector::ShardSelector;

/// Envelope version written by this build.
const ENVELOPE_V1: u8 = 1;

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

/// Largest bincode header written or read: far above any Kubernetes object's metadata (the API
/// server limits annotations to 256 KiB and requests to 3 MiB).
const MAX_HEADER: usize = 16 << 20;

/// Decodes a bincode header with a byte limit tied to its length. bincode allocates a string's
/// or a byte vector's length as read, before reading its bytes, so without a limit a damaged
/// length would ask for up to 2^64 bytes (review finding F15). A valid header claims at most 8
/// bytes of the limit per byte it holds (a one-byte varint counts as a `u64`), so a limit of 16
/// times its length never refuses one.
fn decode_header<T: serde::de::DeserializeOwned>(head: &[u8]) -> Result<T, CodecError> {
    fn limited<T: serde::de::DeserializeOwned, const LIMIT: usize>(head: &[u8]) -> Result<T, CodecError> {
        bincode::serde::decode_from_slice(head, config().with_limit::<LIMIT>())
            .map(|(header, _)| header)
            .map_err(CodecError::Decode)
    }
    match head.len() {
        0..=4096 => limited::<T, { 64 << 10 }>(head),
        4097..=65_536 => limited::<T, { 1 << 20 }>(head),
        65_537..=1_048_576 => limited::<T, { 16 << 20 }>(head),
        n if n <= MAX_HEADER => limited::<T, { 16 * MAX_HEADER }>(head),
        n => Err(CodecError::HeaderTooLarge(n)),
    }
}

/// A value that cannot be encoded or decoded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// An object's JSON is not a Kubernetes object.
    #[error(transparent)]
    Object(#[from] ObjectError),
    /// A stored value has an envelope version this build does not know.
    #[error("stored value has envelope version {0}, this build reads only version {ENVELOPE_V1}: the database was written by a newer durable-informer")]
    UnknownEnvelope(u8),
    /// A stored value is shorter than its header says.
    #[error("stored value is truncated")]
    Truncated,
    /// A stored header does not decode.
    #[error("stored value does not decode: {0}")]
    Decode(#[source] bincode::error::DecodeError),
    /// A header is over the 16 MiB this build writes and reads (a stored one is damaged).
    #[error("header of {0} bytes is over the 16 MiB limit")]
    HeaderTooLarge(usize),
    /// A header does not encode (cannot happen for the types here, reported rather than panicking).
    #[error("value does not encode: {0}")]
    Encode(#[source] bincode::error::EncodeError),
    /// Compressed bytes do not decompress.
    #[error("stored object bytes do not decompress: {0}")]
    Decompress(#[source] std::io::Error),
    /// A stored shard selector does not parse.
    #[error("stored shard selector does not parse: {0}")]
    Shard(#[source] crate::selector::SelectorError),
}

/// How stored object bytes are compressed: as a setting ([`crate::store::StoreConfig::compression`])
/// and as the tag stored next to every blob (`None`, `Zstd` or `Dict`).
///
/// New variants are only ever appended: the tag is part of rows written by older builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Compression {
    /// Stored as received.
    #[default]
    None,
    /// zstd at the given level.
    Zstd(i32),
    /// Setting: zstd at the given level with a dictionary trained per scope on its first
    /// objects (kept in the `dicts` table). Until a scope has a dictionary its objects are
    /// stored as [`Compression::Zstd`]. Never stored as a tag.
    ZstdDict(i32),
    /// Tag: zstd with dictionary `dict` of scope `scope` (a row of the `dicts` table, never
    /// rewritten, so older blobs stay readable after a newer dictionary).
    Dict {
        /// Scope that owns the dictionary.
        scope: u32,
        /// Dictionary id within the scope.
        dict: u32,
    },
}

impl Compression {
    /// Compresses `bytes` without a dictionary (a no-op for [`Compression::None`]; the
    /// dictionary settings compress as plain zstd here).
    pub fn compress(self, bytes: &[u8]) -> Result<Vec<u8>, CodecError> {
        match self {
            Compression::None | Compression::Dict { .. } => Ok(bytes.to_vec()),
            Compression::Zstd(level) | Compression::ZstdDict(level) => {
                zstd::bulk::compress(bytes, level).map_err(CodecError::Decompress)
            }
        }
    }
}

/// The kind of a delta, as in client-go's `DeltaFIFO`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DeltaKind {
    /// A new object.
    Added,
    /// A changed object.
    Updated,
    /// A removed object.
    Deleted,
    /// An object (re)stated by a list.
    Replaced,
    /// A resync: the object did not change.
    Sync,
}

/// Where an object version's bytes are stored: each version's bytes are stored once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DataRef {
    /// In the log entry with this seq.
    Log(u64),
    /// In the row itself (after the log entry holding them was compacted).
    Inline,
}

/// Header of an `objects` row. Inline bytes, if any, follow it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectHeader {
    /// Extracted metadata of the current version.
    pub meta: ObjectMeta,
    /// Where the current version's bytes are.
    pub data: DataRef,
    /// How those bytes are compressed.
    pub compression: Compression,
}

/// Header of a `log` row. The entry's own object bytes (if any) follow it; an inlined copy of
/// the previous version's bytes follows those when `prev` is [`PrevRef::Inline`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogHeader {
    /// Scope id.
    pub scope: u32,
    /// Delta kind.
    pub kind: DeltaKind,
    /// Object key.
    pub key: ObjectKey,
    /// resourceVersion of this version (for deletes, the deletion's RV).
    pub rv: ResourceVersion,
    /// Length of this entry's object bytes (0 when it carries none).
    pub data_len: u32,
    /// Whether this entry carries object bytes (a relist delete or a sync carries none).
    pub has_data: bool,
    /// Compression of the carried bytes.
    pub compression: Compression,
    /// Where the previous version's bytes are (for updates and deletes).
    pub prev: PrevRef,
    /// For deletes seen through a relist: the final state is unknown.
    pub final_state_unknown: bool,
}

/// Where the previous state of an object is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PrevRef {
    /// No previous state (an add).
    None,
    /// In the log entry with this seq.
    Log(u64),
    /// Inlined after this entry's own bytes, with this compression.
    Inline(Compression),
}

/// A watched scope's persisted state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ScopeRecord {
    /// The canonical spec string of the scope.
    pub spec: String,
    /// Last persisted resourceVersion (invariant 2: never ahead of the data).
    pub rv: Option<ResourceVersion>,
    /// Whether an initial list (or relist) completed.
    pub synced: bool,
    /// How many relists ran after the first list.
    pub relist_count: u64,
    /// Why the last relist ran.
    pub last_relist_reason: Option<String>,
    /// When the last relist completed (unix milliseconds).
    pub last_relist_at_ms: Option<u64>,
    /// Indexes this scope maintains.
    pub indexes: Vec<String>,
    /// Number of objects.
    pub object_count: u64,
}

fn encode_with_tail(header: &impl Serialize, tails: &[&[u8]]) -> Result<Vec<u8>, CodecError> {
    let head = bincode::serde::encode_to_vec(header, config()).map_err(CodecError::Encode)?;
    if head.len() > MAX_HEADER {
        return Err(CodecError::HeaderTooLarge(head.len()));
    }
    let head_len = u32::try_from(head.len()).map_err(|_| CodecError::Truncated)?;
    let tail_len: usize = tails.iter().map(|t| t.len()).sum();
    let mut out = Vec::with_capacity(5 + head.len() + tail_len);
    out.push(ENVELOPE_V1);
    out.extend_from_slice(&head_len.to_le_bytes());
    out.extend_from_slice(&head);
    for t in tails {
        out.extend_from_slice(t);
    }
    Ok(out)
}

fn decode_with_tail<T: serde::de::DeserializeOwned>(value: &[u8]) -> Result<(T, &[u8]), CodecError> {
    let (&version, rest) = value.split_first().ok_or(CodecError::Truncated)?;
    if version != ENVELOPE_V1 {
        return Err(CodecError::UnknownEnvelope(version));
    }
    if rest.len() < 4 {
        return Err(CodecError::Truncated);
    }
    let head_len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
    let rest = &rest[4..];
    if rest.len() < head_len {
        return Err(CodecError::Truncated);
    }
    Ok((decode_header(&rest[..head_len])?, &rest[head_len..]))
}

/// Encodes an `objects` row.
pub fn encode_object(header: &ObjectHeader, inline: Option<&[u8]>) -> Result<Vec<u8>, CodecError> {
    encode_with_tail(header, &[inline.unwrap_or_default()])
}

/// [`ObjectHeader`] with the metadata borrowed: the same fields in the same order, so the
/// same bytes, without copying the metadata of every object the writer stores.
#[derive(Serialize)]
struct ObjectHeaderRef<'a> {
    meta: &'a ObjectMeta,
    data: DataRef,
    compression: Compression,
}

/// Encodes an `objects` row without inline bytes from its parts (see [`ObjectHeaderRef`]).
pub(crate) fn encode_object_parts(
    meta: &ObjectMeta,
    data: DataRef,
    compression: Compression,
) -> Result<Vec<u8>, CodecError> {
    encode_with_tail(
        &ObjectHeaderRef {
            meta,
            data,
            compression,
        },
        &[],
    )
}

/// Decodes an `objects` row into its header and inline bytes (empty unless `DataRef::Inline`).
pub fn decode_object(value: &[u8]) -> Result<(ObjectHeader, &[u8]), CodecError> {
    decode_with_tail(value)
}

/// Encodes a `log` row.
pub fn encode_log(header: &LogHeader, data: &[u8], prev_inline: &[u8]) -> Result<Vec<u8>, CodecError> {
    debug_assert_eq!(header.data_len as usize, data.len());
    encode_with_tail(header, &[data, prev_inline])
}

/// Decodes a `log` row into its header, its own bytes and the inlined previous bytes.
pub fn decode_log(value: &[u8]) -> Result<(LogHeader, &[u8], &[u8]), CodecError> {
    let (header, tail): (LogHeader, _) = decode_with_tail(value)?;
    let n = header.data_len as usize;
    if tail.len() < n {
        return Err(CodecError::Truncated);
    }
    let (data, prev) = tail.split_at(n);
    Ok((header, data, prev))
}

/// Encodes a scope record.
pub fn encode_scope(record: &ScopeRecord) -> Result<Vec<u8>, CodecError> {
    encode_with_tail(record, &[])
}

/// Decodes a scope record.
pub fn decode_scope(value: &[u8]) -> Result<ScopeRecord, CodecError> {
    decode_with_tail(value).map(|(r, _)| r)
}

/// The shard of a scope (the `scope_shards` table, schema v5). No row: the scope holds every
/// object of its resource.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShardRecord {
    /// The hash ranges the scope's objects belong to (`None`: all objects). Every stored
    /// object matches it: a change of range removes the others in the same transaction.
    pub range: Option<ShardSelector>,
    /// Ranges added by the last change of range and not fetched yet; the scope's objects of
    /// them are those at the scope's RV, listed before any watch resumes. Cleared by the
    /// transaction that completes the fetch, or by a relist (which lists the whole range).
    pub pending: Option<ShardSelector>,
}

/// The stored form of a [`ShardRecord`]: the selectors as text.
#[derive(Serialize, Deserialize)]
struct ShardRow {
    range: Option<String>,
    pending: Option<String>,
}

/// Encodes a shard record.
pub fn encode_shard(record: &ShardRecord) -> Result<Vec<u8>, CodecError> {
    let row = ShardRow {
        range: record.range.as_ref().map(ToString::to_string),
        pending: record.pending.as_ref().map(ToString::to_string),
    };
    encode_with_tail(&row, &[])
}

/// Decodes a shard record.
pub fn decode_shard(value: &[u8]) -> Result<ShardRecord, CodecError> {
    let (row, _): (ShardRow, _) = decode_with_tail(value)?;
    let parse = |s: Option<String>| {
        s.map(|s| s.parse::<ShardSelector>())
            .transpose()
            .map_err(CodecError::Shard)
    };
    Ok(ShardRecord {
        range: parse(row.range)?,
        pending: parse(row.pending)?,
    })
}

/// Encodes the values an object is indexed under (the `index_rev` table).
pub fn encode_values(values: &[String]) -> Result<Vec<u8>, CodecError> {
    encode_with_tail(&values, &[])
}

/// Decodes the values an object is indexed under.
pub fn decode_values(value: &[u8]) -> Result<Vec<String>, CodecError> {
    decode_with_tail(value).map(|(r, _)| r)
}

/// How far the backfill of an index over a scope's existing objects got (the `index_backfill`
/// table). Objects up to and including `after` have exact index rows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct BackfillProgress {
    /// The last object key backfilled; `None` before the first step.
    pub after: Option<ObjectKey>,
    /// The last log seq committed when `after` was reached: later entries of the scope were
    /// written after that step (see the resume check in the writer).
    pub seq: u64,
}

/// Encodes a backfill progress row.
pub fn encode_backfill(progress: &BackfillProgress) -> Result<Vec<u8>, CodecError> {
    encode_with_tail(progress, &[])
}

/// Decodes a backfill progress row.
pub fn decode_backfill(value: &[u8]) -> Result<BackfillProgress, CodecError> {
    decode_with_tail(value).map(|(r, _)| r)
}

/// What [`CodecError::check_row`] read: the row encoded again, and the object bytes it carries
/// with their compression tags.
type CheckedRow<'a> = (Vec<u8>, Vec<(Compression, &'a [u8])>);

impl CodecError {
    /// Decodes `value` as a row of the stored table `table` (`objects`, `log`, `scopes`,
    /// `scope_shards`, `index_rev` or `index_backfill`) the way the store reads it. Returns
    /// what it read encoded again, and the object bytes the row carries with their compression
    /// tags. The entry point of the damaged-row fuzz targets and tests; exposed for fuzzing
    /// only.
    #[doc(hidden)]
    pub fn check_row<'a>(table: &str, value: &'a [u8]) -> Result<CheckedRow<'a>, CodecError> {
        match table {
            "objects" => {
                let (header, inline) = decode_object(value)?;
                let blobs = match header.data {
                    DataRef::Inline => vec![(header.compression, inline)],
                    DataRef::Log(_) => Vec::new(),
                };
                Ok((encode_object(&header, Some(inline))?, blobs))
            }
            "log" => {
                let (header, data, prev) = decode_log(value)?;
                let mut blobs = Vec::new();
                if header.has_data {
                    blobs.push((header.compression, data));
                }
                if let PrevRef::Inline(c) = header.prev {
                    blobs.push((c, prev));
                }
                Ok((encode_log(&header, data, prev)?, blobs))
            }
            "scopes" => Ok((encode_scope(&decode_scope(value)?)?, Vec::new())),
            "scope_shards" => Ok((encode_shard(&decode_shard(value)?)?, Vec::new())),
            "index_rev" => Ok((encode_values(&decode_values(value)?)?, Vec::new())),
            "index_backfill" => Ok((encode_backfill(&decode_backfill(value)?)?, Vec::new())),
            _ => Err(CodecError::Decode(bincode::error::DecodeError::Other("no such table"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::extract_meta;

    #[test]
    fn an_object_row_from_borrowed_parts_is_byte_identical() {
        let meta = extract_meta(POD).unwrap();
        for (data, compression) in [
            (DataRef::Log(7), Compression::Dict { scope: 3, dict: 1 }),
            (DataRef::Inline, Compression::None),
        ] {
            let owned = ObjectHeader {
                meta: meta.clone(),
                data,
                compression,
            };
            assert_eq!(
                encode_object_parts(&meta, data, compression).unwrap(),
                encode_object(&owned, None).unwrap()
            );
        }
    }

    const POD: &[u8] = br#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web-0","namespace":"prod","uid":"u1","resourceVersion":"42","generation":3,"labels":{"app":"web","tier":"fe"},"annotations":{"a":"b"},"ownerReferences":[{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"web","uid":"u0","controller":true}],"deletionTimestamp":"2026-01-01T00:00:00Z","managedFields":[{"manager":"x"}]},"spec":{"containers":[{"name":"c","image":"i"}]}}"#;

    #[test]
    fn log_rows_round_trip_with_both_tails() {
        let header = LogHeader {
            scope: 3,
            kind: DeltaKind::Updated,
            key: ObjectKey::namespaced("a", "b"),
            rv: "9".into(),
            data_len: 3,
            has_data: true,
            compression: Compression::None,
            prev: PrevRef::Inline(Compression::None),
            final_state_unknown: false,
        };
        let row = encode_log(&header, b"new", b"old").unwrap();
        let (h, data, prev) = decode_log(&row).unwrap();
        assert_eq!((h, data, prev), (header, &b"new"[..], &b"old"[..]));
    }

    #[test]
    fn damaged_rows_give_errors_not_panics() {
        let row = encode_scope(&ScopeRecord::default()).unwrap();
        for cut in 0..row.len() {
            let _ = decode_scope(&row[..cut]);
            let _ = decode_log(&row[..cut]);
            let _ = decode_object(&row[..cut]);
        }
        let mut newer = row.clone();
        newer[0] = 9;
        assert!(matches!(decode_scope(&newer), Err(CodecError::UnknownEnvelope(9))));
    }

    #[test]
    fn shard_records_round_trip() {
        let record = ShardRecord {
            range: Some(ShardSelector::by_uid(1, 4).unwrap()),
            pending: Some(ShardSelector::by_uid(1, 3).unwrap()),
        };
        assert_eq!(decode_shard(&encode_shard(&record).unwrap()).unwrap(), record);
        let empty = ShardRecord::default();
        assert_eq!(decode_shard(&encode_shard(&empty).unwrap()).unwrap(), empty);
    }

    #[test]
    fn zstd_round_trips() {
        let c = Compression::Zstd(1);
        let packed = c.compress(POD).unwrap();
        assert_eq!(c.check_unpack(&packed, None).unwrap(), bytes::Bytes::from_static(POD));
        assert!(c.check_unpack(b"garbage", None).is_err());
    }
}
