//! Value encodings: the only module that uses bincode, plus metadata extraction from object JSON.
//!
//! Every stored value is a *versioned envelope*: one version byte, a little-endian `u32` header
//! length, a bincode header, then (for rows that carry object bytes) the object's bytes as they
//! arrived, so reading the bytes back is a slice, not a decode. Metadata extraction ([`scan_object`])
//! decodes only `metadata` from the JSON through a borrowed serde struct, skipping the rest, and
//! in the same pass notes where `metadata.managedFields` sits so it can be cut out without
//! another parse.

use std::borrow::Cow;
use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::schema::{ObjectKey, ResourceVersion};

/// Envelope version written by this build.
const ENVELOPE_V1: u8 = 1;

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

/// A value that cannot be encoded or decoded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// The object JSON is not valid JSON or has a malformed `metadata`.
    #[error("object is not valid Kubernetes JSON: {0}")]
    Json(#[source] serde_json::Error),
    /// The object has no `metadata.name`.
    #[error("object has no metadata.name")]
    MissingName,
    /// The JSON is valid but not an object (an array, a string, a number).
    #[error("object is not a JSON object")]
    NotAnObject,
    /// A stored value has an envelope version this build does not know.
    #[error("stored value has envelope version {0}, this build reads only version {ENVELOPE_V1}: the database was written by a newer durable-informer")]
    UnknownEnvelope(u8),
    /// A stored value is shorter than its header says.
    #[error("stored value is truncated")]
    Truncated,
    /// A stored header does not decode.
    #[error("stored value does not decode: {0}")]
    Decode(#[source] bincode::error::DecodeError),
    /// A header does not encode (cannot happen for the types here, reported rather than panicking).
    #[error("value does not encode: {0}")]
    Encode(#[source] bincode::error::EncodeError),
    /// Compressed bytes do not decompress.
    #[error("stored object bytes do not decompress: {0}")]
    Decompress(#[source] std::io::Error),
}

/// An owner reference, as extracted from `metadata.ownerReferences`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct OwnerReference {
    /// `apiVersion` of the owner.
    pub api_version: String,
    /// `kind` of the owner.
    pub kind: String,
    /// Name of the owner (same namespace as the object).
    pub name: String,
    /// UID of the owner.
    pub uid: String,
    /// Whether this owner is the managing controller.
    pub controller: bool,
}

/// The metadata the store needs, extracted from an object's JSON without decoding the rest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ObjectMeta {
    /// `metadata.namespace`, `None` for cluster-scoped objects.
    pub namespace: Option<String>,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: Option<String>,
    /// `metadata.resourceVersion`.
    pub resource_version: ResourceVersion,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
    /// `metadata.ownerReferences`.
    pub owner_references: Vec<OwnerReference>,
    /// `metadata.deletionTimestamp`.
    pub deletion_timestamp: Option<String>,
}

impl ObjectMeta {
    /// The object's key (`namespace/name` or `name`).
    #[must_use]
    pub fn key(&self) -> ObjectKey {
        ObjectKey {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Head<'a> {
    #[serde(borrow)]
    metadata: Option<RawMeta<'a>>,
    /// Only whether they are there matters (even as `null`): a LIST item that has either gets
    /// no `apiVersion`/`kind` added, which would duplicate the member.
    #[serde(borrow, default, deserialize_with = "present")]
    api_version: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    kind: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawMeta<'a> {
    #[serde(borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    namespace: Option<Cow<'a, str>>,
    #[serde(borrow)]
    uid: Option<Cow<'a, str>>,
    #[serde(borrow)]
    resource_version: Option<Cow<'a, str>>,
    generation: Option<i64>,
    #[serde(borrow)]
    labels: Option<BTreeMap<Cow<'a, str>, Cow<'a, str>>>,
    #[serde(borrow)]
    annotations: Option<BTreeMap<Cow<'a, str>, Cow<'a, str>>>,
    #[serde(borrow)]
    owner_references: Option<Vec<RawOwner<'a>>>,
    #[serde(borrow)]
    deletion_timestamp: Option<Cow<'a, str>>,
    /// Kept as a borrowed slice so its position in the input is known (see [`scan_object`]).
    #[serde(borrow, default, deserialize_with = "present")]
    managed_fields: Option<&'a RawValue>,
}

/// `Some` whenever the member is present, even as `null` (a plain `Option` maps `null` to `None`).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawOwner<'a> {
    #[serde(borrow, default)]
    api_version: Cow<'a, str>,
    #[serde(borrow, default)]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    name: Cow<'a, str>,
    #[serde(borrow, default)]
    uid: Cow<'a, str>,
    controller: Option<bool>,
}

fn owned_map(m: Option<BTreeMap<Cow<'_, str>, Cow<'_, str>>>) -> BTreeMap<String, String> {
    m.unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// Extracts [`ObjectMeta`] from an object's JSON bytes, decoding nothing but `metadata`.
///
/// ```
/// let meta = durable_informer::store::extract_meta(
///     br#"{"kind":"Pod","metadata":{"name":"a","namespace":"ns","resourceVersion":"7","labels":{"app":"x"}}}"#,
/// ).unwrap();
/// assert_eq!(meta.key().to_string(), "ns/a");
/// assert_eq!(meta.resource_version.as_str(), "7");
/// ```
pub fn extract_meta(json: &[u8]) -> Result<ObjectMeta, CodecError> {
    scan_object(json).map(|s| s.meta)
}

/// What one pass over an object's JSON finds. The ingest path reads each object once: this
/// pass yields the metadata, whether the object names its own type, and where
/// `metadata.managedFields` sits, so dropping that field later is a copy, not another parse.
#[derive(Debug)]
pub(crate) struct Scanned {
    pub(crate) meta: ObjectMeta,
    /// Top-level `apiVersion` or `kind` present (LIST items usually have neither).
    pub(crate) has_type_meta: bool,
    pub(crate) managed_fields: ManagedFields,
}

impl Scanned {
    /// The same scan after `shift` bytes were inserted right after the opening brace.
    pub(crate) fn shifted(mut self, shift: usize) -> Self {
        if let ManagedFields::At { cut, key } = &mut self.managed_fields {
            *cut = cut.start + shift..cut.end + shift;
            *key += shift;
        }
        self
    }
}

/// Where `metadata.managedFields` is in an object's bytes, as found by [`scan_object`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum ManagedFields {
    /// Not scanned (bytes built elsewhere): look for it.
    #[default]
    Unknown,
    /// The object has none.
    Absent,
    /// Present, but not laid out as the plain `"managedFields":` a cut needs (an escaped key).
    Present,
    /// Removing `cut` (the member and one separating comma) leaves valid JSON without it;
    /// `key` is where its `"managedFields"` key starts, checked again before cutting.
    At {
        /// Bytes to remove.
        cut: std::ops::Range<usize>,
        /// Start of the member's key.
        key: usize,
    },
}

/// One pass over an object's JSON: metadata, type presence and the `managedFields` position.
pub(crate) fn scan_object(json: &[u8]) -> Result<Scanned, CodecError> {
    let head: Head<'_> = serde_json::from_slice(json).map_err(CodecError::Json)?;
    // serde's derived structs also accept a JSON array; a Kubernetes object never is one.
    if json.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(CodecError::NotAnObject);
    }
    let has_type_meta = head.api_version.is_some() || head.kind.is_some();
    let m = head.metadata.ok_or(CodecError::MissingName)?;
    let name = m.name.filter(|n| !n.is_empty()).ok_or(CodecError::MissingName)?;
    let managed_fields = match m.managed_fields {
        None => ManagedFields::Absent,
        Some(raw) => managed_fields_cut(json, raw.get().as_bytes()),
    };
    let meta = ObjectMeta {
        namespace: m.namespace.filter(|n| !n.is_empty()).map(Cow::into_owned),
        name: name.into_owned(),
        uid: m.uid.map(Cow::into_owned),
        resource_version: ResourceVersion(m.resource_version.map(Cow::into_owned).unwrap_or_default()),
        generation: m.generation,
        labels: owned_map(m.labels),
        annotations: owned_map(m.annotations),
        owner_references: m
            .owner_references
            .unwrap_or_default()
            .into_iter()
            .map(|o| OwnerReference {
                api_version: o.api_version.into_owned(),
                kind: o.kind.into_owned(),
                name: o.name.into_owned(),
                uid: o.uid.into_owned(),
                controller: o.controller.unwrap_or(false),
            })
            .collect(),
        deletion_timestamp: m.deletion_timestamp.map(Cow::into_owned),
    };
    Ok(Scanned {
        meta,
        has_type_meta,
        managed_fields,
    })
}

/// The bytes to remove to drop the `managedFields` member whose value is `value` (a subslice
/// of `json`, which the parser has validated). `Present` when the layout around it is not the
/// plain `"managedFields":` the servers write (an escaped key, say): the caller then strips by
/// parsing.
fn managed_fields_cut(json: &[u8], value: &[u8]) -> ManagedFields {
    const KEY: &[u8] = b"\"managedFields\"";
    let base = json.as_ptr() as usize;
    let Some(start) = (value.as_ptr() as usize).checked_sub(base) else {
        return ManagedFields::Present;
    };
    let end = start + value.len();
    if end > json.len() {
        return ManagedFields::Present;
    }
    let back = |mut i: usize| {
        while i > 0 && json[i - 1].is_ascii_whitespace() {
            i -= 1;
        }
        i
    };
    let colon = back(start);
    if colon == 0 || json[colon - 1] != b':' {
        return ManagedFields::Present;
    }
    let key_end = back(colon - 1);
    // The parser matched this member's unescaped key to `managedFields`; raw bytes equal to the
    // plain key can only be that key (an escaped quote would have changed its text).
    let Some(key) = key_end.checked_sub(KEY.len()).filter(|k| &json[*k..key_end] == KEY) else {
        return ManagedFields::Present;
    };
    let before = back(key);
    match before.checked_sub(1).map(|i| json[i]) {
        Some(b',') => ManagedFields::At {
            cut: before - 1..end,
            key,
        },
        Some(b'{') => {
            // The first member: take the comma after it instead, if another member follows.
            let mut after = end;
            while after < json.len() && json[after].is_ascii_whitespace() {
                after += 1;
            }
            let cut_end = if json.get(after) == Some(&b',') { after + 1 } else { end };
            ManagedFields::At { cut: key..cut_end, key }
        }
        _ => ManagedFields::Present,
    }
}

/// An object as received: its JSON bytes (kept exactly as they arrived) and its metadata.
#[derive(Clone)]
pub struct RawObject {
    /// Extracted metadata.
    pub meta: ObjectMeta,
    /// The JSON bytes.
    pub bytes: Bytes,
    /// Where `managedFields` was in `bytes` when they were scanned, and which bytes those were
    /// (start address and length): a hint that is ignored once `bytes` is replaced.
    pub(crate) scan: Option<(usize, usize, ManagedFields)>,
}

// Equality and `Debug` ignore the scan hint: it says where a field is, not what the object is.
impl std::fmt::Debug for RawObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawObject")
            .field("meta", &self.meta)
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl PartialEq for RawObject {
    fn eq(&self, other: &Self) -> bool {
        self.meta == other.meta && self.bytes == other.bytes
    }
}

impl Eq for RawObject {}

impl RawObject {
    /// Extracts the metadata of `bytes`.
    pub fn from_json(bytes: impl Into<Bytes>) -> Result<Self, CodecError> {
        let bytes = bytes.into();
        let scanned = scan_object(&bytes)?;
        Ok(Self::scanned(bytes, scanned))
    }

    pub(crate) fn scanned(bytes: Bytes, scanned: Scanned) -> Self {
        Self {
            meta: scanned.meta,
            scan: Some((bytes.as_ptr() as usize, bytes.len(), scanned.managed_fields)),
            bytes,
        }
    }

    /// An object whose metadata the caller already has (read back from the store).
    pub(crate) fn from_parts(meta: ObjectMeta, bytes: Bytes) -> Self {
        Self {
            meta,
            bytes,
            scan: None,
        }
    }

    /// Replaces `bytes` with the same object without `managedFields`, and says so in the hint,
    /// so a later look at the new bytes never applies the old position to them.
    pub(crate) fn set_stripped(&mut self, bytes: Bytes) {
        self.scan = Some((bytes.as_ptr() as usize, bytes.len(), ManagedFields::Absent));
        self.bytes = bytes;
    }

    /// The object's key.
    #[must_use]
    pub fn key(&self) -> ObjectKey {
        self.meta.key()
    }

    /// Where `managedFields` is in the current `bytes`, if these are the bytes that were
    /// scanned (`Unknown` otherwise).
    pub(crate) fn managed_fields(&self) -> ManagedFields {
        match &self.scan {
            Some((addr, len, mf)) if *addr == self.bytes.as_ptr() as usize && *len == self.bytes.len() => match mf {
                ManagedFields::At { key, .. } if self.bytes.get(*key..key + 15) != Some(&b"\"managedFields\""[..]) => {
                    ManagedFields::Unknown
                }
                mf => mf.clone(),
            },
            _ => ManagedFields::Unknown,
        }
    }
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

    fn decompress(self, bytes: &[u8]) -> Result<Bytes, CodecError> {
        match self {
            Compression::None => Ok(Bytes::copy_from_slice(bytes)),
            Compression::Zstd(_) | Compression::ZstdDict(_) => {
                let mut out = Vec::new();
                zstd::stream::copy_decode(bytes, &mut out).map_err(CodecError::Decompress)?;
                Ok(Bytes::from(out))
            }
            Compression::Dict { .. } => Err(CodecError::Decompress(std::io::Error::other(
                "dictionary-compressed bytes need their dictionary",
            ))),
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
    let (header, _) = bincode::serde::decode_from_slice(&rest[..head_len], config()).map_err(CodecError::Decode)?;
    Ok((header, &rest[head_len..]))
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

/// Decompresses stored object bytes that need no dictionary (see `dict::DictCache::unpack`).
pub fn decompress(compression: Compression, bytes: &[u8]) -> Result<Bytes, CodecError> {
    compression.decompress(bytes)
}

/// Encodes a scope record.
pub fn encode_scope(record: &ScopeRecord) -> Result<Vec<u8>, CodecError> {
    encode_with_tail(record, &[])
}

/// Decodes a scope record.
pub fn decode_scope(value: &[u8]) -> Result<ScopeRecord, CodecError> {
    decode_with_tail(value).map(|(r, _)| r)
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn extracts_every_metadata_field() {
        let m = extract_meta(POD).unwrap();
        assert_eq!(m.namespace.as_deref(), Some("prod"));
        assert_eq!(m.name, "web-0");
        assert_eq!(m.uid.as_deref(), Some("u1"));
        assert_eq!(m.resource_version.as_str(), "42");
        assert_eq!(m.generation, Some(3));
        assert_eq!(m.labels.get("tier").map(String::as_str), Some("fe"));
        assert_eq!(m.annotations.len(), 1);
        assert_eq!(m.owner_references[0].kind, "ReplicaSet");
        assert!(m.owner_references[0].controller);
        assert!(m.deletion_timestamp.is_some());
    }

    #[test]
    fn escaped_strings_are_unescaped() {
        let m = extract_meta(br#"{"metadata":{"name":"a","labels":{"k":"v\"q\u00e9"}}}"#).unwrap();
        assert_eq!(m.labels["k"], "v\"q\u{e9}");
    }

    #[test]
    fn objects_without_metadata_or_name_are_refused() {
        assert!(matches!(
            extract_meta(br#"{"kind":"Pod"}"#),
            Err(CodecError::MissingName)
        ));
        assert!(matches!(
            extract_meta(br#"{"metadata":{"namespace":"a"}}"#),
            Err(CodecError::MissingName)
        ));
        assert!(matches!(
            extract_meta(br#"{"metadata":{"name":""}}"#),
            Err(CodecError::MissingName)
        ));
        assert!(matches!(
            extract_meta(br#"{"metadata":{"name":"a""#),
            Err(CodecError::Json(_))
        ));
        assert!(matches!(
            extract_meta(br#"{"metadata":{"name":5}}"#),
            Err(CodecError::Json(_))
        ));
        assert!(matches!(extract_meta(b"\xff\xfe"), Err(CodecError::Json(_))));
    }

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
    fn zstd_round_trips() {
        let c = Compression::Zstd(1);
        let packed = c.compress(POD).unwrap();
        assert_eq!(decompress(c, &packed).unwrap(), Bytes::from_static(POD));
        assert!(decompress(c, b"garbage").is_err());
    }
}
