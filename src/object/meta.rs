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
}
