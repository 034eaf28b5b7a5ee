//! The database schema: every table, and the key types with their byte encodings.
//!
//! Keys are hand-encoded so that byte order equals logical order (redb compares `&[u8]` keys
//! lexicographically). Values are bincode envelopes from [`super::codec`]; nothing here knows
//! bincode.
//!
//! | table | key | value |
//! |---|---|---|
//! | `meta` | name | schema version, cluster identity, crate version |
//! | `scopes` | [`ScopeId`] | [`super::codec::ScopeRecord`] |
//! | `scope_names` | canonical scope spec | [`ScopeId`] |
//! | `objects` | [`ObjectRowKey`]: scope, namespace, name | [`super::codec::StoredObject`] |
//! | `log` | [`Seq`] | [`super::codec::LogEntry`] |
//! | `index` | scope, index name, value, object key | `()` |
//! | `index_rev` | scope, index name, object key | the values the object is indexed under |
//! | `relist` | scope, object key | a listed object staged during a relist |
//! | `scope_cursors` | (scope id, consumer name) | last delivered [`Seq`] (schema v4; v1–v3 had `cursors`, keyed by name only) |
//! | `dicts` | (scope id, dict id) | a zstd dictionary (schema v2; rows are never rewritten) |
//! | `commit_times` | seq of the first log entry a commit wrote | unix milliseconds of that commit (schema v3) |
//! | `index_backfill` | (scope id, index name) | [`super::codec::BackfillProgress`] of an index still being backfilled (schema v3) |
//! | `scope_shards` | [`ScopeId`] | [`super::codec::ShardRecord`]: the scope's shard range and ranges still to fetch (schema v5) |
//! | `scope_last_use` | [`ScopeId`] | unix milliseconds when a process last had the scope registered (created on first use; a file without it reads as "never recorded") |

use std::fmt;

use redb::TableDefinition;

use crate::object::{KeyError, ObjectKey};

/// Schema-level metadata: `schema_version`, `cluster_identity`, `crate_version`.
pub const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
/// Watched scopes by id.
pub const SCOPES: TableDefinition<u32, &[u8]> = TableDefinition::new("scopes");
/// Canonical scope spec (see [`super::ScopeSpec::canonical`]) → scope id.
pub const SCOPE_NAMES: TableDefinition<&str, u32> = TableDefinition::new("scope_names");
/// Current objects; one namespace of one scope is a contiguous key range.
pub const OBJECTS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("objects");
/// The global delta log, dense seq numbers.
pub const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
/// Secondary index rows: presence of (scope, index, value, key).
pub const INDEX: TableDefinition<&[u8], ()> = TableDefinition::new("index");
/// Reverse index map: (scope, index, key) → values, so stale rows can be dropped.
pub const INDEX_REV: TableDefinition<&[u8], &[u8]> = TableDefinition::new("index_rev");
/// Objects listed during a relist, staged until the list completes.
pub const RELIST: TableDefinition<&[u8], &[u8]> = TableDefinition::new("relist");
/// Durable consumer cursors by (scope id, consumer name) (schema v4). A consumer reads one
/// scope's entries, so its position is only meaningful for that scope: two informers on one
/// database may use the same handler name without sharing a cursor.
pub const CURSORS: TableDefinition<(u32, &str), u64> = TableDefinition::new("scope_cursors");
/// Durable consumer cursors by name only (schema v1 to v3). Only the migrations open it:
/// v1 creates it, v4 moves its rows to [`CURSORS`] and deletes it.
pub const CURSORS_V1: TableDefinition<&str, u64> = TableDefinition::new("cursors");
/// zstd dictionaries by (scope id, dict id), trained on a scope's first objects (schema v2).
/// A row is written once and never changed or removed: blobs tagged
/// [`super::codec::Compression::Dict`] name the row they need.
pub const DICTS: TableDefinition<(u32, u32), &[u8]> = TableDefinition::new("dicts");

/// When log entries were committed (schema v3): one row per commit that appended entries, keyed
/// by the seq of its first entry, so entries `[key, next key)` share the row's unix milliseconds.
/// Times never decrease with the key. Compaction keeps the table trimmed: its first key is the
/// first retained log seq (the row covering that seq is re-keyed to it), and an empty log has
/// no rows.
pub const COMMIT_TIMES: TableDefinition<u64, u64> = TableDefinition::new("commit_times");
/// Indexes whose backfill over a scope's existing objects has not finished (schema v3), with
/// how far it got. A row exists from the `ensure_index` that started it until the step that
/// finished it, which also adds the index to the scope record.
pub const INDEX_BACKFILL: TableDefinition<(u32, &str), &[u8]> = TableDefinition::new("index_backfill");

/// The shard range of a sharded scope and the added ranges not yet fetched (schema v5). A
/// scope without a row holds every object of its resource.
pub const SHARDS: TableDefinition<u32, &[u8]> = TableDefinition::new("scope_shards");

/// When a process last had each scope registered (unix milliseconds): written when a scope is
/// registered, every few minutes while it stays registered, and when the store closes. Created
/// by the first write; readers take a missing table as empty, so it needs no migration.
pub const SCOPE_USE: TableDefinition<u32, u64> = TableDefinition::new("scope_last_use");

/// `meta` key holding the highest scope id ever handed out (u32, big endian), so that a dropped
/// scope's id is never given to another: its log entries stay until retention removes them.
pub const META_SCOPE_ID_HIGH: &str = "scope_id_high";
/// `meta` key holding the schema version (u32, big endian).
pub const META_SCHEMA_VERSION: &str = "schema_version";
/// `meta` key holding the cluster identity (UTF-8).
pub const META_CLUSTER_IDENTITY: &str = "cluster_identity";
/// `meta` key holding the last log seq ever handed out (u64, big endian).
pub const META_LAST_SEQ: &str = "last_seq";
/// `meta` key holding the version of the crate that created the database (UTF-8).
pub const META_CREATED_BY: &str = "created_by";

/// Separator inside composite keys. Kubernetes names, namespaces, label keys and values never
/// contain NUL, and NUL sorts before every other byte, so `("a", "b") < ("ab", "")`.
const SEP: u8 = 0;

/// Identifier of a watched scope (resource + namespace + selectors) inside one database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScopeId(pub u32);

impl fmt::Display for ScopeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "scope#{}", self.0)
    }
}

/// Position in the delta log. Dense and increasing (invariant 4); 0 means "before the first
/// entry".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Seq(pub u64);

impl fmt::Display for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The name of a secondary index.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct IndexName(pub String);

impl fmt::Display for IndexName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for IndexName {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

/// The name of a durable consumer's cursor into the log (a durable handler's name). Consumers
/// of different scopes may share a name.
///
/// ```
/// use durable_informer::store::CursorName;
///
/// let name: CursorName = "audit".into();
/// assert_eq!(name.to_string(), "audit");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct CursorName(pub String);

impl CursorName {
    /// The name as text.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for CursorName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for CursorName {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

impl From<String> for CursorName {
    fn from(s: String) -> Self {
        Self(s)
    }
}

/// A value an object is indexed under.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct IndexValue(pub String);

impl fmt::Display for IndexValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for IndexValue {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

impl From<String> for IndexValue {
    fn from(s: String) -> Self {
        Self(s)
    }
}

/// Byte encodings of composite keys. Each `encode_*` has a matching `decode_*` and the pair is
/// held to "decode(encode(x)) == x, and encode preserves order" by tests.
pub mod keys {
    use super::{IndexName, IndexValue, KeyError, ObjectKey, ScopeId, SEP};

    fn push_key(out: &mut Vec<u8>, key: &ObjectKey) {
        // Cluster-scoped: empty namespace; sorts before every namespace.
        out.extend_from_slice(key.namespace_str().as_bytes());
        out.push(SEP);
        out.extend_from_slice(key.name.as_bytes());
    }

    fn split_key(bytes: &[u8]) -> Result<ObjectKey, KeyError> {
        let malformed = || KeyError::Malformed(bytes.to_vec());
        let pos = bytes.iter().position(|b| *b == SEP).ok_or_else(malformed)?;
        let ns = std::str::from_utf8(&bytes[..pos]).map_err(|_| malformed())?;
        let name = std::str::from_utf8(&bytes[pos + 1..]).map_err(|_| malformed())?;
        Ok(ObjectKey {
            namespace: (!ns.is_empty()).then(|| ns.to_owned()),
            name: name.to_owned(),
        })
    }

    /// `objects` / `relist` key: scope (u32 BE), namespace, NUL, name.
    #[must_use]
    pub fn object(scope: ScopeId, key: &ObjectKey) -> Vec<u8> {
        let mut out = Vec::with_capacity(6 + key.name.len() + key.namespace_str().len());
        out.extend_from_slice(&scope.0.to_be_bytes());
        push_key(&mut out, key);
        out
    }

    /// Decodes an `objects` key.
    pub fn decode_object(bytes: &[u8]) -> Result<(ScopeId, ObjectKey), KeyError> {
        if bytes.len() < 5 {
            return Err(KeyError::Malformed(bytes.to_vec()));
        }
        let scope = ScopeId(u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]));
        Ok((scope, split_key(&bytes[4..])?))
    }

    /// Range `[start, end)` covering every object of a scope.
    #[must_use]
    pub fn scope_range(scope: ScopeId) -> (Vec<u8>, Vec<u8>) {
        let start = scope.0.to_be_bytes().to_vec();
        let end = match scope.0.checked_add(1) {
            Some(next) => next.to_be_bytes().to_vec(),
            None => vec![0xff; 5],
        };
        (start, end)
    }

    /// Range `[start, end)` covering one namespace of a scope (`""` = cluster-scoped objects).
    #[must_use]
    pub fn namespace_range(scope: ScopeId, namespace: &str) -> (Vec<u8>, Vec<u8>) {
        let mut start = scope.0.to_be_bytes().to_vec();
        start.extend_from_slice(namespace.as_bytes());
        let mut end = start.clone();
        start.push(SEP);
        // Every key of the namespace is `ns SEP name`; `ns 0x01` is just past them.
        end.push(SEP + 1);
        (start, end)
    }

    fn index_prefix(scope: ScopeId, index: &IndexName) -> Vec<u8> {
        let mut out = scope.0.to_be_bytes().to_vec();
        out.extend_from_slice(index.0.as_bytes());
        out.push(SEP);
        out
    }

    /// `index` key: scope, index name, NUL, value, NUL, object key.
    #[must_use]
    pub fn index(scope: ScopeId, index: &IndexName, value: &IndexValue, key: &ObjectKey) -> Vec<u8> {
        let mut out = index_prefix(scope, index);
        out.extend_from_slice(value.0.as_bytes());
        out.push(SEP);
        push_key(&mut out, key);
        out
    }

    /// Range over every row of one index value.
    #[must_use]
    pub fn index_value_range(scope: ScopeId, index: &IndexName, value: &IndexValue) -> (Vec<u8>, Vec<u8>) {
        let mut start = index_prefix(scope, index);
        start.extend_from_slice(value.0.as_bytes());
        let mut end = start.clone();
        start.push(SEP);
        end.push(SEP + 1);
        (start, end)
    }

    /// Range over every row of one index.
    #[must_use]
    pub fn index_range(scope: ScopeId, index: &IndexName) -> (Vec<u8>, Vec<u8>) {
        let start = index_prefix(scope, index);
        let mut end = start.clone();
        if let Some(last) = end.last_mut() {
            *last = SEP + 1;
        }
        (start, end)
    }

    /// Decodes an `index` key into (value, object key), given its index name.
    pub fn decode_index(bytes: &[u8], scope: ScopeId, index: &IndexName) -> Result<(IndexValue, ObjectKey), KeyError> {
        let prefix = index_prefix(scope, index);
        let malformed = || KeyError::Malformed(bytes.to_vec());
        let rest = bytes.strip_prefix(prefix.as_slice()).ok_or_else(malformed)?;
        let pos = rest.iter().position(|b| *b == SEP).ok_or_else(malformed)?;
        let value = std::str::from_utf8(&rest[..pos]).map_err(|_| malformed())?;
        Ok((IndexValue(value.to_owned()), split_key(&rest[pos + 1..])?))
    }

    /// `index_rev` key: scope, index name, NUL, object key.
    #[must_use]
    pub fn index_rev(scope: ScopeId, index: &IndexName, key: &ObjectKey) -> Vec<u8> {
        let mut out = index_prefix(scope, index);
        push_key(&mut out, key);
        out
    }
}

impl ScopeId {
    /// Decodes `key` as a key of the stored table `table` (`objects`, `relist` or `index`) the
    /// way the store reads it, and returns what it read encoded again. An `index` key is decoded
    /// with the scope and index name it starts with. The entry point of the damaged-row fuzz
    /// targets and tests; exposed for fuzzing only.
    #[doc(hidden)]
    pub fn check_key(table: &str, key: &[u8]) -> Result<Vec<u8>, KeyError> {
        match table {
            "objects" | "relist" => {
                let (scope, object) = keys::decode_object(key)?;
                Ok(keys::object(scope, &object))
            }
            "index" => {
                let scope = ScopeId(key.get(..4).map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]])));
                let rest = key.get(4..).unwrap_or_default();
                let name = rest.split(|b| *b == SEP).next().unwrap_or_default();
                let index = IndexName(String::from_utf8_lossy(name).into_owned());
                let (value, object) = keys::decode_index(key, scope, &index)?;
                Ok(keys::index(scope, &index, &value, &object))
            }
            _ => Err(KeyError::Malformed(key.to_vec())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::keys;
    use super::*;
    use proptest::prelude::*;

    fn name() -> impl Strategy<Value = String> {
        "[a-z0-9][a-z0-9.-]{0,12}"
    }

    fn object_key() -> impl Strategy<Value = ObjectKey> {
        (proptest::option::of(name()), name()).prop_map(|(namespace, name)| ObjectKey { namespace, name })
    }

    proptest! {
        #[test]
        fn object_keys_round_trip_and_keep_order(scope_a in 0u32..4, a in object_key(), scope_b in 0u32..4, b in object_key()) {
            let ea = keys::object(ScopeId(scope_a), &a);
            let eb = keys::object(ScopeId(scope_b), &b);
            prop_assert_eq!(keys::decode_object(&ea).unwrap(), (ScopeId(scope_a), a.clone()));
            let logical = (scope_a, a.namespace_str().to_owned(), a.name.clone())
                .cmp(&(scope_b, b.namespace_str().to_owned(), b.name.clone()));
            prop_assert_eq!(ea.cmp(&eb), logical);
        }

        #[test]
        fn namespace_range_holds_exactly_that_namespace(scope in 0u32..3, key in object_key(), ns in name()) {
            let (start, end) = keys::namespace_range(ScopeId(1), &ns);
            let enc = keys::object(ScopeId(scope), &key);
            let inside = enc >= start && enc < end;
            prop_assert_eq!(inside, scope == 1 && key.namespace.as_deref() == Some(ns.as_str()));
        }

        #[test]
        fn index_keys_round_trip_and_keep_order(v1 in "[a-z=]{0,6}", v2 in "[a-z=]{0,6}", a in object_key(), b in object_key()) {
            let idx = IndexName::from("labels");
            let e1 = keys::index(ScopeId(7), &idx, &IndexValue(v1.clone()), &a);
            let e2 = keys::index(ScopeId(7), &idx, &IndexValue(v2.clone()), &b);
            prop_assert_eq!(keys::decode_index(&e1, ScopeId(7), &idx).unwrap(), (IndexValue(v1.clone()), a.clone()));
            let logical = (v1.clone(), a.namespace_str().to_owned(), a.name.clone())
                .cmp(&(v2.clone(), b.namespace_str().to_owned(), b.name.clone()));
            prop_assert_eq!(e1.cmp(&e2), logical);
            let (start, end) = keys::index_value_range(ScopeId(7), &idx, &IndexValue(v1.clone()));
            prop_assert!(e1 >= start && e1 < end);
            prop_assert_eq!(e2 >= start && e2 < end, v1 == v2);
        }
    }

    #[test]
    fn cluster_scoped_objects_sort_before_namespaced_ones() {
        let c = keys::object(ScopeId(1), &ObjectKey::cluster("zzz"));
        let n = keys::object(ScopeId(1), &ObjectKey::namespaced("a", "a"));
        assert!(c < n);
    }

    #[test]
    fn scope_ranges_do_not_overlap() {
        let (_, end1) = keys::scope_range(ScopeId(1));
        let (start2, _) = keys::scope_range(ScopeId(2));
        assert!(end1 <= start2);
        let k = keys::object(ScopeId(1), &ObjectKey::namespaced("zz", "zz"));
        assert!(k < end1);
        let (_, end_max) = keys::scope_range(ScopeId(u32::MAX));
        assert!(keys::object(ScopeId(u32::MAX), &ObjectKey::cluster("z")) < end_max);
    }

    #[test]
    fn a_malformed_stored_key_is_an_error() {
        assert!(keys::decode_object(&[0, 0, 0, 1, b'x']).is_err());
    }
}
