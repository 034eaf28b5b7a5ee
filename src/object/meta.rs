//! What every stage reads from an object's JSON: its metadata, found in one pass.
//!
//! [`scan_object`] decodes only `metadata` through a borrowed serde struct, skipping the rest,
//! and in the same pass notes where `metadata.managedFields` sits so the field can be cut out
//! later without another parse.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::{ObjectKey, ResourceVersion};

/// An object's JSON that is not a Kubernetes object.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ObjectError {
    /// The object JSON is not valid JSON or has a malformed `metadata` (or, decoding into a
    /// type, does not match the type).
    #[error("object is not valid Kubernetes JSON: {0}")]
    Json(#[source] serde_json::Error),
    /// The object has no `metadata.name`.
    #[error("object has no metadata.name")]
    MissingName,
    /// The JSON is valid but not an object (an array, a string, a number).
    #[error("object is not a JSON object")]
    NotAnObject,
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

/// Labels or annotations: a string map sorted by key, as `BTreeMap<String, String>`, held in
/// two allocations whatever its size (its keys and values in one string, and where each one
/// ends). An informer keeps every object's metadata in memory, so this is most of what an
/// object costs when its JSON is not held.
///
/// It reads as a `BTreeMap<String, String>` does (`get`, `contains_key`, `iter` in key order,
/// `len`, indexing), is built from one (`From`) or from pairs (`collect`, the last of equal
/// keys winning), turns back into one (`BTreeMap::from(&map)`), and serializes as a map (the
/// same bytes as a `BTreeMap`).
///
/// ```
/// use durable_informer::object::StringMap;
/// let labels: StringMap = [("tier", "web"), ("app", "shop")].into_iter().collect();
/// assert_eq!(labels.get("app"), Some("shop"));
/// assert_eq!(&labels["tier"], "web");
/// assert_eq!(labels.keys().collect::<Vec<_>>(), ["app", "tier"]);
/// ```
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct StringMap {
    /// Every key and value, in key order: key 0, value 0, key 1, …
    text: Box<str>,
    /// Where each of them ends in `text`.
    ends: Box<[u32]>,
}

impl StringMap {
    /// An empty map (it allocates nothing).
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// From pairs sorted by key, each key once.
    fn from_sorted<'a, I>(pairs: I) -> Self
    where
        I: Iterator<Item = (&'a str, &'a str)> + Clone,
    {
        let (mut len, mut n) = (0usize, 0usize);
        for (k, v) in pairs.clone() {
            len += k.len() + v.len();
            n += 2;
        }
        let mut text = String::with_capacity(len);
        let mut ends = Vec::with_capacity(n);
        // Metadata is bounded far below 4 GiB (etcd's request limit); a map over it is a bug.
        let end = |t: &String| u32::try_from(t.len()).unwrap_or_else(|_| panic!("a string map over 4 GiB"));
        for (k, v) in pairs {
            text.push_str(k);
            ends.push(end(&text));
            text.push_str(v);
            ends.push(end(&text));
        }
        Self {
            text: text.into_boxed_str(),
            ends: ends.into_boxed_slice(),
        }
    }

    fn slice(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        self.text.get(start..self.ends[i] as usize).unwrap_or_default()
    }

    fn find(&self, key: &str) -> Option<usize> {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.slice(2 * mid).cmp(key) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(mid),
            }
        }
        None
    }

    /// The bytes of its two allocations (0: none), for the memory budget's estimates.
    pub(crate) fn heap_bytes(&self) -> (usize, usize) {
        (self.text.len(), std::mem::size_of_val(&*self.ends))
    }

    /// The number of entries.
    #[must_use]
    pub fn len(&self) -> usize {
        self.ends.len() / 2
    }

    /// Whether it has no entry.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The value of `key`.
    #[must_use]
    pub fn get(&self, key: &str) -> Option<&str> {
        self.find(key).map(|i| self.slice(2 * i + 1))
    }

    /// Whether `key` has a value.
    #[must_use]
    pub fn contains_key(&self, key: &str) -> bool {
        self.find(key).is_some()
    }

    /// The entries in key order.
    #[must_use]
    pub fn iter(&self) -> StringMapIter<'_> {
        StringMapIter {
            map: self,
            range: 0..self.len(),
        }
    }

    /// The keys in order.
    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &str> + ExactSizeIterator + '_ {
        self.iter().map(|(k, _)| k)
    }

    /// The values in key order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &str> + ExactSizeIterator + '_ {
        self.iter().map(|(_, v)| v)
    }

    /// Sets `key` to `value` (the map is rebuilt: meant for building, not for hot paths);
    /// returns the value it replaced.
    pub fn insert(&mut self, key: impl Into<String>, value: impl Into<String>) -> Option<String> {
        let mut map = BTreeMap::from(&*self);
        let old = map.insert(key.into(), value.into());
        *self = Self::from(map);
        old
    }

    /// Removes `key` (the map is rebuilt); returns its value.
    pub fn remove(&mut self, key: &str) -> Option<String> {
        let i = self.find(key)?;
        let old = self.slice(2 * i + 1).to_owned();
        *self = Self::from_sorted(self.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, kv)| kv));
        Some(old)
    }
}

/// The entries of a [`StringMap`] in key order.
#[derive(Debug, Clone)]
pub struct StringMapIter<'a> {
    map: &'a StringMap,
    range: std::ops::Range<usize>,
}

impl<'a> Iterator for StringMapIter<'a> {
    type Item = (&'a str, &'a str);

    fn next(&mut self) -> Option<Self::Item> {
        let i = self.range.next()?;
        Some((self.map.slice(2 * i), self.map.slice(2 * i + 1)))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.range.size_hint()
    }
}

impl DoubleEndedIterator for StringMapIter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        let i = self.range.next_back()?;
        Some((self.map.slice(2 * i), self.map.slice(2 * i + 1)))
    }
}

impl ExactSizeIterator for StringMapIter<'_> {}

impl<'a> IntoIterator for &'a StringMap {
    type Item = (&'a str, &'a str);
    type IntoIter = StringMapIter<'a>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<K: AsRef<str>, V: AsRef<str>> FromIterator<(K, V)> for StringMap {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut pairs: Vec<(K, V)> = iter.into_iter().collect();
        // Stable: of equal keys, the last given stays last, and is the one kept.
        pairs.sort_by(|a, b| a.0.as_ref().cmp(b.0.as_ref()));
        let last = |i: usize| {
            pairs
                .get(i + 1)
                .is_none_or(|next| next.0.as_ref() != pairs[i].0.as_ref())
        };
        Self::from_sorted(
            pairs
                .iter()
                .enumerate()
                .filter(|(i, _)| last(*i))
                .map(|(_, (k, v))| (k.as_ref(), v.as_ref())),
        )
    }
}

impl<K: AsRef<str>, V: AsRef<str>, const N: usize> From<[(K, V); N]> for StringMap {
    fn from(pairs: [(K, V); N]) -> Self {
        pairs.into_iter().collect()
    }
}

impl From<BTreeMap<String, String>> for StringMap {
    fn from(map: BTreeMap<String, String>) -> Self {
        Self::from(&map)
    }
}

impl From<&BTreeMap<String, String>> for StringMap {
    fn from(map: &BTreeMap<String, String>) -> Self {
        Self::from_sorted(map.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }
}

impl From<&StringMap> for BTreeMap<String, String> {
    fn from(map: &StringMap) -> Self {
        map.iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect()
    }
}

impl From<StringMap> for BTreeMap<String, String> {
    fn from(map: StringMap) -> Self {
        Self::from(&map)
    }
}

impl PartialEq<BTreeMap<String, String>> for StringMap {
    fn eq(&self, other: &BTreeMap<String, String>) -> bool {
        self.len() == other.len()
            && self
                .iter()
                .zip(other)
                .all(|((a, b), (c, d))| a == c.as_str() && b == d.as_str())
    }
}

impl std::ops::Index<&str> for StringMap {
    type Output = str;

    /// The value of `key`; panics when it has none, as `BTreeMap`'s indexing does.
    fn index(&self, key: &str) -> &str {
        self.get(key).unwrap_or_else(|| panic!("no entry {key:?} in the map"))
    }
}

impl std::fmt::Debug for StringMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl Serialize for StringMap {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for StringMap {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = StringMap;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of strings")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut access: A) -> Result<StringMap, A::Error> {
                let mut pairs: Vec<(Cow<'de, str>, Cow<'de, str>)> =
                    Vec::with_capacity(access.size_hint().unwrap_or(0).min(1024));
                while let Some((k, v)) = access.next_entry::<CowStr<'de>, CowStr<'de>>()? {
                    pairs.push((k.0, v.0));
                }
                Ok(pairs.into_iter().collect())
            }
        }
        deserializer.deserialize_map(Visit)
    }
}

/// A string borrowed from the input when it can be, owned when it must (escapes).
struct CowStr<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for CowStr<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = CowStr<'de>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }

            fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<CowStr<'de>, E> {
                Ok(CowStr(Cow::Borrowed(v)))
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<CowStr<'de>, E> {
                Ok(CowStr(Cow::Owned(v.to_owned())))
            }

            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<CowStr<'de>, E> {
                Ok(CowStr(Cow::Owned(v)))
            }
        }
        deserializer.deserialize_str(Visit)
    }
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
    pub labels: StringMap,
    /// `metadata.annotations`.
    pub annotations: StringMap,
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
    labels: Option<StringMap>,
    annotations: Option<StringMap>,
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

/// The owned owner references, in a vector of their exact number: collected in place from
/// the parser's vector it would keep that one's spare room (four where one is usual), for as
/// long as an informer holds the metadata.
fn owners(raw: Vec<RawOwner<'_>>) -> Vec<OwnerReference> {
    let mut out = Vec::with_capacity(raw.len());
    out.extend(raw.into_iter().map(|o| OwnerReference {
        api_version: o.api_version.into_owned(),
        kind: o.kind.into_owned(),
        name: o.name.into_owned(),
        uid: o.uid.into_owned(),
        controller: o.controller.unwrap_or(false),
    }));
    out
}

/// Extracts [`ObjectMeta`] from an object's JSON bytes, decoding nothing but `metadata`.
///
/// ```
/// let meta = durable_informer::object::extract_meta(
///     br#"{"kind":"Pod","metadata":{"name":"a","namespace":"ns","resourceVersion":"7","labels":{"app":"x"}}}"#,
/// ).unwrap();
/// assert_eq!(meta.key().to_string(), "ns/a");
/// assert_eq!(meta.resource_version.as_str(), "7");
/// ```
pub fn extract_meta(json: &[u8]) -> Result<ObjectMeta, ObjectError> {
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
pub(crate) fn scan_object(json: &[u8]) -> Result<Scanned, ObjectError> {
    let head: Head<'_> = serde_json::from_slice(json).map_err(ObjectError::Json)?;
    // serde's derived structs also accept a JSON array; a Kubernetes object never is one.
    if json.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ObjectError::NotAnObject);
    }
    let has_type_meta = head.api_version.is_some() || head.kind.is_some();
    let m = head.metadata.ok_or(ObjectError::MissingName)?;
    let name = m.name.filter(|n| !n.is_empty()).ok_or(ObjectError::MissingName)?;
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
        labels: m.labels.unwrap_or_default(),
        annotations: m.annotations.unwrap_or_default(),
        owner_references: owners(m.owner_references.unwrap_or_default()),
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

#[cfg(test)]
mod tests {
    use super::*;

    const POD: &[u8] = br#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web-0","namespace":"prod","uid":"u1","resourceVersion":"42","generation":3,"labels":{"app":"web","tier":"fe"},"annotations":{"a":"b"},"ownerReferences":[{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"web","uid":"u0","controller":true}],"deletionTimestamp":"2026-01-01T00:00:00Z","managedFields":[{"manager":"x"}]},"spec":{"containers":[{"name":"c","image":"i"}]}}"#;

    #[test]
    fn extracts_every_metadata_field() {
        let m = extract_meta(POD).unwrap();
        assert_eq!(m.namespace.as_deref(), Some("prod"));
        assert_eq!(m.name, "web-0");
        assert_eq!(m.uid.as_deref(), Some("u1"));
        assert_eq!(m.resource_version.as_str(), "42");
        assert_eq!(m.generation, Some(3));
        assert_eq!(m.labels.get("tier"), Some("fe"));
        assert_eq!(m.annotations.len(), 1);
        assert_eq!(m.owner_references[0].kind, "ReplicaSet");
        assert!(m.owner_references[0].controller);
        assert!(m.deletion_timestamp.is_some());
    }

    #[test]
    fn owner_references_take_no_spare_room() {
        let m = extract_meta(POD).unwrap();
        assert_eq!(m.owner_references.len(), 1);
        assert_eq!(m.owner_references.capacity(), 1, "held for as long as the object is");
    }

    #[test]
    fn escaped_strings_are_unescaped() {
        let m = extract_meta(br#"{"metadata":{"name":"a","labels":{"k":"v\"q\u00e9"}}}"#).unwrap();
        assert_eq!(&m.labels["k"], "v\"q\u{e9}");
    }

    #[test]
    fn objects_without_metadata_or_name_are_refused() {
        assert!(matches!(
            extract_meta(br#"{"kind":"Pod"}"#),
            Err(ObjectError::MissingName)
        ));
        assert!(matches!(
            extract_meta(br#"{"metadata":{"namespace":"a"}}"#),
            Err(ObjectError::MissingName)
        ));
        assert!(matches!(
            extract_meta(br#"{"metadata":{"name":""}}"#),
            Err(ObjectError::MissingName)
        ));
        assert!(matches!(
            extract_meta(br#"{"metadata":{"name":"a""#),
            Err(ObjectError::Json(_))
        ));
        assert!(matches!(
            extract_meta(br#"{"metadata":{"name":5}}"#),
            Err(ObjectError::Json(_))
        ));
        assert!(matches!(extract_meta(b"\xff\xfe"), Err(ObjectError::Json(_))));
    }

    #[test]
    fn a_string_map_reads_as_the_btree_map_it_was_built_from() {
        let pairs = [
            ("tier", "fe"),
            ("app", "web"),
            ("a.b/c", ""),
            ("app", "shop"),
            ("", "empty key"),
        ];
        let map: StringMap = pairs.into_iter().collect();
        let want: BTreeMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        assert_eq!(map.len(), want.len(), "equal keys kept once");
        assert_eq!(map, want);
        assert_eq!(
            map.get("app"),
            Some("shop"),
            "the last of equal keys wins, as in a BTreeMap"
        );
        assert_eq!(map.get(""), Some("empty key"));
        assert_eq!(map.get("a.b/c"), Some(""));
        assert_eq!(map.get("ap"), None);
        assert_eq!(map.get("zzz"), None);
        assert!(map.contains_key("tier") && !map.contains_key("tie"));
        let order: Vec<(&str, &str)> = map.iter().collect();
        let want_order: Vec<(&str, &str)> = want.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(order, want_order);
        assert_eq!(map.iter().next_back(), Some(("tier", "fe")));
        assert_eq!(BTreeMap::from(&map), want);
        assert_eq!(StringMap::from(want.clone()), map);
        assert_eq!(format!("{map:?}"), format!("{want:?}"));
        let mut m = map.clone();
        assert_eq!(m.insert("app", "x"), Some("shop".to_owned()));
        assert_eq!(m.insert("new", "y"), None);
        assert_eq!(m.remove("tier"), Some("fe".to_owned()));
        assert_eq!(m.remove("tier"), None);
        assert_eq!(m.keys().collect::<Vec<_>>(), ["", "a.b/c", "app", "new"]);
        assert!(StringMap::new().is_empty() && StringMap::new().get("").is_none());
    }

    #[test]
    fn a_string_map_serializes_as_a_btree_map() {
        let want: BTreeMap<String, String> = [("b", "2"), ("a", "1\"é"), ("c", "")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let map = StringMap::from(&want);
        let config = bincode::config::standard();
        let bin = bincode::serde::encode_to_vec(&map, config).unwrap();
        assert_eq!(bin, bincode::serde::encode_to_vec(&want, config).unwrap());
        let (back, _): (StringMap, usize) = bincode::serde::decode_from_slice(&bin, config).unwrap();
        assert_eq!(back, map);
        let json = serde_json::to_string(&map).unwrap();
        assert_eq!(json, serde_json::to_string(&want).unwrap());
        assert_eq!(serde_json::from_str::<StringMap>(&json).unwrap(), map);
        assert!(serde_json::from_str::<StringMap>(r#"{"a":1}"#).is_err());
    }

    /// The stored rows' metadata (bincode) is byte for byte what it was with `BTreeMap`s, so
    /// databases written before read the same.
    #[test]
    fn object_meta_encodes_as_before_the_compact_maps() {
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        struct Before {
            namespace: Option<String>,
            name: String,
            uid: Option<String>,
            resource_version: ResourceVersion,
            generation: Option<i64>,
            labels: BTreeMap<String, String>,
            annotations: BTreeMap<String, String>,
            owner_references: Vec<OwnerReference>,
            deletion_timestamp: Option<String>,
        }
        let m = extract_meta(POD).unwrap();
        let before = Before {
            namespace: m.namespace.clone(),
            name: m.name.clone(),
            uid: m.uid.clone(),
            resource_version: m.resource_version.clone(),
            generation: m.generation,
            labels: BTreeMap::from(&m.labels),
            annotations: BTreeMap::from(&m.annotations),
            owner_references: m.owner_references.clone(),
            deletion_timestamp: m.deletion_timestamp.clone(),
        };
        let config = bincode::config::standard();
        let old = bincode::serde::encode_to_vec(&before, config).unwrap();
        assert_eq!(bincode::serde::encode_to_vec(&m, config).unwrap(), old);
        let (read, _): (ObjectMeta, usize) = bincode::serde::decode_from_slice(&old, config).unwrap();
        assert_eq!(read, m);
    }
}
