//! Transforms applied to each object before it is persisted: drop `metadata.managedFields` (by
//! default), a user function over the JSON, and a size limit.
//!
//! Dropping a field must not cost a full decode: the metadata scan that read the object on
//! arrival also noted where `metadata.managedFields` sits, so dropping it is a copy around that
//! range. Bytes the scan did not see (or an escaped key) are walked as raw JSON slices and
//! re-joined without the field; everything else stays byte for byte either way.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::object::{ManagedFields, RawObject};

/// A user transform over an object's JSON. Return `Ok(None)` to drop the object.
pub type TransformFn = Arc<dyn Fn(&[u8]) -> Result<Option<Vec<u8>>, String> + Send + Sync>;

/// What to do with an object larger than the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OversizePolicy {
    /// Skip it and report an error (the informer keeps running without it).
    #[default]
    Error,
    /// Skip it with a warning.
    Skip,
}

/// The transform pipeline.
///
/// An object it refuses (the user function returns `Ok(None)` or fails, or it is over the size
/// limit) is not stored; a version of it already stored is removed, as a `Deleted` whose final
/// state is only the object's identity (see [`tombstone`]), the same outcome a relist gives.
/// Deletes go through the pipeline too, so their final state in the log is transformed.
#[derive(Clone)]
pub struct Transform {
    /// Drop `metadata.managedFields` (default true).
    pub drop_managed_fields: bool,
    /// A user function applied after that.
    pub func: Option<TransformFn>,
    /// Largest object stored, in bytes (after transforms).
    pub max_object_bytes: usize,
    /// What happens to larger objects.
    pub oversize: OversizePolicy,
}

impl Default for Transform {
    fn default() -> Self {
        Self {
            drop_managed_fields: true,
            func: None,
            max_object_bytes: 16 << 20,
            oversize: OversizePolicy::Error,
        }
    }
}

impl fmt::Debug for Transform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transform")
            .field("drop_managed_fields", &self.drop_managed_fields)
            .field("func", &self.func.is_some())
            .field("max_object_bytes", &self.max_object_bytes)
            .field("oversize", &self.oversize)
            .finish()
    }
}

/// Why an object was not stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransformError {
    /// Larger than the limit.
    #[error("{key}: object is {size} bytes, more than the limit of {limit}; it was not stored")]
    TooLarge {
        /// The object's key.
        key: String,
        /// Its size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The user function failed or returned something that is not an object.
    #[error("{key}: transform failed: {detail}")]
    Failed {
        /// The object's key.
        key: String,
        /// What failed.
        detail: String,
    },
}

impl Transform {
    /// Applies the pipeline. `Ok(None)`: the user function dropped the object.
    pub fn apply(&self, obj: RawObject) -> Result<Option<RawObject>, TransformError> {
        let key = obj.key().to_string();
        let mut obj = obj;
        if self.drop_managed_fields {
            match obj.managed_fields() {
                ManagedFields::Absent => {}
                // Found by the scan that extracted the metadata: a copy around it, no parse.
                ManagedFields::At { cut, .. } => {
                    let mut out = Vec::with_capacity(obj.bytes.len() - cut.len());
                    out.extend_from_slice(&obj.bytes[..cut.start]);
                    out.extend_from_slice(&obj.bytes[cut.end..]);
                    obj.set_stripped(Bytes::from(out));
                }
                ManagedFields::Present => {
                    if let Some(stripped) = strip_parsed(&obj.bytes) {
                        obj.set_stripped(Bytes::from(stripped));
                    }
                }
                ManagedFields::Unknown => {
                    if let Some(stripped) = strip_managed_fields(&obj.bytes) {
                        obj.set_stripped(Bytes::from(stripped));
                    }
                }
            }
        }
        if let Some(f) = &self.func {
            match f(&obj.bytes) {
                Ok(Some(out)) => {
                    obj = RawObject::from_json(out).map_err(|e| TransformError::Failed {
                        key: key.clone(),
                        detail: e.to_string(),
                    })?;
                }
                Ok(None) => return Ok(None),
                Err(detail) => return Err(TransformError::Failed { key, detail }),
            }
        }
        if obj.bytes.len() > self.max_object_bytes {
            return Err(TransformError::TooLarge {
                key,
                size: obj.bytes.len(),
                limit: self.max_object_bytes,
            });
        }
        Ok(Some(obj))
    }
}

/// What stands in for an object that left the store because the transform dropped it (the user
/// function, the size limit or a failure): `apiVersion`, `kind` and the identifying metadata
/// (`name`, `namespace`, `uid`, `resourceVersion`), nothing else. It is the final state of the
/// `Deleted` delta that removes a stored object whose new version is not stored, so the store
/// never keeps a version older than its RV, and nothing the transform refused reaches the log.
/// `None` when `json` is not an object with metadata (the source already rejected those).
#[must_use]
pub fn tombstone(json: &[u8]) -> Option<RawObject> {
    let top: Members<'_> = serde_json::from_slice(json).ok()?;
    let meta = top.0.iter().find(|(k, _)| k == "metadata")?.1;
    let meta_members: Members<'_> = serde_json::from_str(meta.get()).ok()?;
    let kept_meta: Vec<_> = meta_members
        .0
        .into_iter()
        .filter(|(k, _)| matches!(k.as_ref(), "name" | "namespace" | "uid" | "resourceVersion"))
        .collect();
    let new_meta = join(&kept_meta, None);
    let kept_top: Vec<_> = top
        .0
        .into_iter()
        .filter(|(k, _)| matches!(k.as_ref(), "apiVersion" | "kind" | "metadata"))
        .collect();
    RawObject::from_json(join(&kept_top, Some(("metadata", &new_meta)))).ok()
}

/// The top-level members of a JSON object as raw slices, in order.
struct Members<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de> serde::Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<Cow<'de, str>, &'de RawValue>()? {
                    out.push((k, v));
                }
                Ok(Members(out))
            }
        }
        d.deserialize_map(V)
    }
}

fn join(members: &[(Cow<'_, str>, &RawValue)], replace: Option<(&str, &[u8])>) -> Vec<u8> {
    let mut out = Vec::new();
    out.push(b'{');
    let mut first = true;
    for (k, v) in members {
        if !first {
            out.push(b',');
        }
        first = false;
        // Keys were unescaped by the parser; re-escape through serde_json.
        out.extend_from_slice(&serde_json::to_vec(k.as_ref()).unwrap_or_else(|_| b"\"\"".to_vec()));
        out.push(b':');
        match replace {
            Some((name, bytes)) if k == name => out.extend_from_slice(bytes),
            _ => out.extend_from_slice(v.get().as_bytes()),
        }
    }
    out.push(b'}');
    out
}

/// Removes `metadata.managedFields`; `None` when there is none (or the JSON is not an object,
/// which the caller's metadata extraction already rejected). A key spelled with escapes
/// (`"managed\u0046ields"`) is missed by the quick pre-check here; [`Transform::apply`] strips it
/// too, because the metadata scan saw it.
#[must_use]
pub fn strip_managed_fields(json: &[u8]) -> Option<Vec<u8>> {
    // Cheap pre-check: most objects from a transform-enabled server have no managedFields.
    memchr::memmem::find(json, b"managedFields")?;
    strip_parsed(json)
}

/// [`strip_managed_fields`] without the pre-check (for a key written with escapes).
fn strip_parsed(json: &[u8]) -> Option<Vec<u8>> {
    let top: Members<'_> = serde_json::from_slice(json).ok()?;
    let meta = top.0.iter().find(|(k, _)| k == "metadata")?.1;
    let meta_members: Members<'_> = serde_json::from_str(meta.get()).ok()?;
    if !meta_members.0.iter().any(|(k, _)| k == "managedFields") {
        return None;
    }
    let kept: Vec<_> = meta_members
        .0
        .into_iter()
        .filter(|(k, _)| k != "managedFields")
        .collect();
    let new_meta = join(&kept, None);
    Some(join(&top.0, Some(("metadata", &new_meta))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn managed_fields_are_dropped_and_everything_else_kept() {
        let json = br#"{"kind":"Pod","metadata":{"name":"a","managedFields":[{"manager":"kubectl","fieldsV1":{"f:a":{}}}],"labels":{"x":"y"}},"spec":{"k":"v\"q"}}"#;
        let out = strip_managed_fields(json).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert!(v["metadata"].get("managedFields").is_none());
        assert_eq!(v["metadata"]["labels"]["x"], "y");
        assert_eq!(v["spec"]["k"], "v\"q");
        assert_eq!(v["kind"], "Pod");
    }

    /// The strip the transform runs on a scanned object (a cut at the position the metadata
    /// scan found) must equal the strip by parsing, for any layout a server or a person writes.
    fn strip_both_ways(json: &[u8]) -> (serde_json::Value, serde_json::Value) {
        let scanned = RawObject::from_json(json.to_vec()).unwrap();
        assert!(
            matches!(scanned.managed_fields(), ManagedFields::At { .. }),
            "the scan did not place managedFields in {}",
            String::from_utf8_lossy(json)
        );
        let cut = Transform::default().apply(scanned).unwrap().unwrap();
        let parsed = strip_managed_fields(json).unwrap();
        let cut: serde_json::Value = serde_json::from_slice(&cut.bytes).expect("the cut left valid JSON");
        (cut, serde_json::from_slice(&parsed).unwrap())
    }

    proptest::proptest! {
        #[test]
        fn the_cut_equals_the_parsed_strip(
            before in proptest::collection::vec(("[a-z]{1,8}", "[a-z\\\\\"]{0,6}"), 0..4),
            after in proptest::collection::vec(("[a-z]{1,8}", "[a-z\\\\\"]{0,6}"), 0..4),
            pretty in proptest::bool::ANY,
            managed in proptest::sample::select(vec![
                serde_json::json!([{"manager": "kubectl", "fieldsV1": {"f:a": {}}}]),
                serde_json::json!([]),
                serde_json::Value::Null,
            ]),
        ) {
            let mut meta = serde_json::Map::new();
            for (k, v) in &before {
                meta.insert(format!("b{k}"), v.clone().into());
            }
            meta.insert("managedFields".into(), managed);
            for (k, v) in &after {
                meta.insert(format!("z{k}"), v.clone().into());
            }
            meta.insert("name".into(), "a".into());
            let obj = serde_json::json!({"kind": "ConfigMap", "metadata": meta, "data": {"managedFields": "x"}});
            let json = if pretty { serde_json::to_vec_pretty(&obj) } else { serde_json::to_vec(&obj) }.unwrap();
            let (cut, parsed) = strip_both_ways(&json);
            proptest::prop_assert_eq!(&cut, &parsed);
            proptest::prop_assert!(cut["metadata"].get("managedFields").is_none());
            proptest::prop_assert_eq!(&cut["data"]["managedFields"], "x");
        }
    }

    /// `{k: v, …}` with `sep` around every key, colon and value, as a person or a server
    /// might lay it out.
    fn object(sep: &str, members: &[(String, String)]) -> String {
        let body: Vec<String> = members
            .iter()
            .map(|(k, v)| format!("{sep}{}{sep}:{sep}{v}{sep}", serde_json::Value::from(k.as_str())))
            .collect();
        format!("{{{}}}", body.join(","))
    }

    proptest::proptest! {
        /// Hand-laid JSON (serde's maps sort keys, which would hide cases): `managedFields` at
        /// any position of `metadata`, values with quotes, escapes, brackets and commas, and
        /// decoys the cut must leave alone: a `spec.managedFields` before or after `metadata`
        /// and a last-applied-configuration annotation that quotes a whole object. The oracle
        /// is the original parsed, minus that one member.
        #[test]
        fn the_cut_removes_exactly_metadata_managed_fields(
            others in proptest::collection::btree_map("x[a-z]{0,6}", r#"[a-z\\"{}\[\],: ]{0,8}"#, 0..4),
            position in 0usize..6,
            managers in proptest::collection::vec(r#"[a-z\\"{}\[\],:]{0,8}"#, 0..3),
            null_value in proptest::bool::ANY,
            spec_first in proptest::bool::ANY,
            annotated in proptest::bool::ANY,
            sep in proptest::sample::select(vec!["", " ", "\n  ", "\r\n\t"]),
        ) {
            let managed = if null_value {
                serde_json::Value::Null
            } else {
                managers
                    .iter()
                    .map(|m| serde_json::json!({"manager": m, "fieldsV1": {"f:metadata": {"f:managedFields": {}}}}))
                    .collect()
            };
            let mut meta: Vec<(String, String)> = others
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::from(v.as_str()).to_string()))
                .collect();
            meta.push(("name".into(), "\"a\"".into()));
            if annotated {
                let applied = serde_json::json!({"metadata": {"name": "a", "managedFields": [{"manager": "x"}]}}).to_string();
                let annotations = serde_json::json!({"kubectl.kubernetes.io/last-applied-configuration": applied});
                meta.push(("annotations".into(), annotations.to_string()));
            }
            meta.insert(position.min(meta.len()), ("managedFields".into(), managed.to_string()));
            let spec = ("spec".to_string(), r#"{"managedFields":[{"manager":"decoy"}],"x":"}"}"#.to_string());
            let mut top = vec![("kind".to_string(), "\"ConfigMap\"".to_string())];
            if spec_first {
                top.push(spec.clone());
            }
            top.push(("metadata".into(), object(sep, &meta)));
            if !spec_first {
                top.push(spec);
            }
            let json = object(sep, &top);

            let mut want: serde_json::Value = serde_json::from_str(&json).unwrap();
            want["metadata"].as_object_mut().unwrap().remove("managedFields");
            let (cut, parsed) = strip_both_ways(json.as_bytes());
            proptest::prop_assert_eq!(&cut, &want, "{}", json);
            proptest::prop_assert_eq!(&parsed, &want);
        }
    }

    #[test]
    fn stripped_bytes_carry_a_hint_that_nothing_is_left_to_cut() {
        let obj = RawObject::from_json(br#"{"metadata":{"name":"a","managedFields":[]},"spec":{}}"#.to_vec()).unwrap();
        let out = Transform::default().apply(obj).unwrap().unwrap();
        assert_eq!(out.managed_fields(), ManagedFields::Absent);
        assert_eq!(&out.bytes[..], br#"{"metadata":{"name":"a"},"spec":{}}"#);
    }

    #[test]
    fn the_cut_handles_first_last_and_only_members() {
        for json in [
            &br#"{"metadata":{"managedFields":[],"name":"a"}}"#[..],
            br#"{"metadata":{"name":"a","managedFields":[{"x":1}]}}"#,
            br#"{"metadata" : { "managedFields" : null , "name" : "a" } }"#,
            br#"{"metadata":{"name":"a",
                "managedFields":  [ ]
            }, "spec":{}}"#,
        ] {
            let (cut, parsed) = strip_both_ways(json);
            assert_eq!(cut, parsed, "{}", String::from_utf8_lossy(json));
        }
    }

    #[test]
    fn replaced_bytes_are_stripped_by_parsing_not_by_a_stale_cut() {
        let mut obj = RawObject::from_json(
            br#"{"metadata":{"name":"a","labels":{"long":"xxxxxxxxxxxxxxxxxxxxxxxx"},"managedFields":[]}}"#.to_vec(),
        )
        .unwrap();
        // Other bytes, where the old cut would fall elsewhere.
        obj.bytes = Bytes::from_static(br#"{"metadata":{"name":"a","managedFields":[],"labels":{"x":"y"}}}"#);
        assert_eq!(obj.managed_fields(), ManagedFields::Unknown);
        let out = Transform::default().apply(obj).unwrap().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.bytes).unwrap();
        assert_eq!(v, serde_json::json!({"metadata":{"name":"a","labels":{"x":"y"}}}));
    }

    #[test]
    fn an_escaped_key_falls_back_to_parsing() {
        let json = br#"{"metadata":{"name":"a","managed\u0046ields":[1]}}"#;
        let obj = RawObject::from_json(json.to_vec()).unwrap();
        assert_eq!(obj.managed_fields(), ManagedFields::Present);
        let out = Transform::default().apply(obj).unwrap().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.bytes).unwrap();
        assert_eq!(v, serde_json::json!({"metadata":{"name":"a"}}));
    }

    #[test]
    fn objects_without_managed_fields_are_untouched() {
        assert!(strip_managed_fields(br#"{"metadata":{"name":"a"}}"#).is_none());
        // The word appears, but not as a metadata field.
        assert!(strip_managed_fields(br#"{"metadata":{"name":"a"},"data":{"managedFields":"1"}}"#).is_none());
    }

    #[test]
    fn a_tombstone_keeps_only_the_identity() {
        let json = br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"n","uid":"u1","resourceVersion":"7","labels":{"x":"y"},"managedFields":[]},"data":{"big":"xxxx"}}"#;
        let t = tombstone(json).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&t.bytes).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"n","uid":"u1","resourceVersion":"7"}})
        );
        assert_eq!(t.key().to_string(), "n/a");
        assert_eq!(t.meta.resource_version.0, "7");
        assert!(tombstone(b"[1]").is_none());
        assert!(tombstone(br#"{"kind":"X"}"#).is_none());
    }

    #[test]
    fn size_limit_and_user_function() {
        let obj = RawObject::from_json(br#"{"metadata":{"name":"a","namespace":"n"},"data":{"x":"12345"}}"#.to_vec())
            .unwrap();
        let t = Transform {
            max_object_bytes: 10,
            ..Transform::default()
        };
        assert!(matches!(t.apply(obj.clone()), Err(TransformError::TooLarge { .. })));
        let t = Transform {
            func: Some(Arc::new(|_| Ok(None))),
            ..Transform::default()
        };
        assert_eq!(t.apply(obj.clone()).unwrap(), None);
        let t = Transform {
            func: Some(Arc::new(|_| Ok(Some(b"not json".to_vec())))),
            ..Transform::default()
        };
        assert!(matches!(t.apply(obj), Err(TransformError::Failed { .. })));
    }
}
