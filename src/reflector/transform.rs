//! Transforms applied to each object before it is persisted: drop `metadata.managedFields` (by
//! default), a user function over the JSON, and a size limit.
//!
//! Dropping a field must not cost a full decode: the top level and `metadata` are walked as raw
//! JSON slices and re-joined without the field; everything else stays byte for byte.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::store::RawObject;

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
            if let Some(stripped) = strip_managed_fields(&obj.bytes) {
                obj.bytes = Bytes::from(stripped);
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
/// which the caller's metadata extraction already rejected).
#[must_use]
pub fn strip_managed_fields(json: &[u8]) -> Option<Vec<u8>> {
    // Cheap pre-check: most objects from a transform-enabled server have no managedFields.
    if !json.windows(15).any(|w| w == b"\"managedFields\"") {
        return None;
    }
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
