//! Pre-built object versions: the benchmark's fast write path. A template of one object, with
//! its resourceVersion and one label value left as holes, is rendered into the stored bytes
//! by concatenation, so a write costs no JSON parsing (the general update path parses and
//! serialises the object twice, which capped the benchmark's producer near 11,000 writes/s).

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;

use super::object::{build_obj, meta_mut, Obj};
use super::{ApiError, EventKind, State};

/// Placeholders that never occur in a real object (the template is checked for them).
const RV_HOLE: &str = "@@durable-informer-rv@@";
const LABEL_HOLE: &str = "@@durable-informer-label@@";

/// An object version whose resourceVersion and one label value are filled in at write time;
/// see [`Sim::prebuild`](crate::sim::Sim::prebuild).
#[derive(Debug, Clone)]
pub struct Prebuilt {
    res: usize,
    key: String,
    ns: String,
    name: String,
    label: String,
    /// The object's other labels.
    labels: BTreeMap<String, String>,
    fields: Vec<(&'static str, String)>,
    /// The bytes around the two holes, and which hole comes first.
    parts: [Bytes; 3],
    rv_first: bool,
    prefix_len: usize,
}

impl State {
    /// A template of the current state of an object, with holes for its resourceVersion and
    /// the value of `label`.
    pub(crate) fn prebuild(&self, res: usize, ns: Option<&str>, name: &str, label: &str) -> Result<Prebuilt, ApiError> {
        let (def, key, old) = self.stored(res, ns, name)?;
        let mut v = old.value();
        let meta = meta_mut(&mut v)?;
        meta.insert("resourceVersion".into(), Value::String(RV_HOLE.into()));
        let labels = meta
            .entry("labels")
            .or_insert_with(|| Value::Object(serde_json::Map::new()));
        let Some(labels) = labels.as_object_mut() else {
            return Err(ApiError::bad_request("metadata.labels is not an object"));
        };
        labels.insert(label.into(), Value::String(LABEL_HOLE.into()));
        let built = build_obj(&def, key, v)?;
        let full = built.full;
        let find = |hole: &str| {
            let at = full.windows(hole.len()).position(|w| w == hole.as_bytes());
            let again = at.and_then(|a| full[a + 1..].windows(hole.len()).position(|w| w == hole.as_bytes()));
            match (at, again) {
                (Some(a), None) => Ok(a),
                _ => Err(ApiError::bad_request("the object holds a template placeholder")),
            }
        };
        let (rv_at, label_at) = (find(RV_HOLE)?, find(LABEL_HOLE)?);
        let ((first, first_len), (second, second_len)) = if rv_at < label_at {
            ((rv_at, RV_HOLE.len()), (label_at, LABEL_HOLE.len()))
        } else {
            ((label_at, LABEL_HOLE.len()), (rv_at, RV_HOLE.len()))
        };
        let mut labels = built.labels;
        labels.remove(label);
        Ok(Prebuilt {
            res,
            key: built.key,
            ns: built.ns,
            name: built.name,
            label: label.to_owned(),
            labels,
            fields: built.fields,
            parts: [
                full.slice(..first),
                full.slice(first + first_len..second),
                full.slice(second + second_len..),
            ],
            rv_first: rv_at < label_at,
            prefix_len: built.prefix_len,
        })
    }

    /// Writes the next version of a pre-built object with `value` as its label's value (which
    /// must need no JSON escaping); returns its resourceVersion. Anything else changed in the
    /// object since [`prebuild`](Self::prebuild) is overwritten by the template.
    pub(crate) fn write_prebuilt(&mut self, pre: &Prebuilt, value: &str) -> Result<u64, ApiError> {
        if value.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
            return Err(ApiError::bad_request("a pre-built label value must need no escaping"));
        }
        let (_, key, old) = self.stored(pre.res, Some(pre.ns.as_str()).filter(|n| !n.is_empty()), &pre.name)?;
        let rv = self.rv + 1;
        let rv_s = rv.to_string();
        let (a, b) = if pre.rv_first {
            (rv_s.as_str(), value)
        } else {
            (value, rv_s.as_str())
        };
        let [p0, p1, p2] = &pre.parts;
        let mut full = Vec::with_capacity(p0.len() + p1.len() + p2.len() + a.len() + b.len());
        for chunk in [p0.as_ref(), a.as_bytes(), p1.as_ref(), b.as_bytes(), p2.as_ref()] {
            full.extend_from_slice(chunk);
        }
        let mut labels = pre.labels.clone();
        labels.insert(pre.label.clone(), value.to_owned());
        let obj = Arc::new(Obj {
            key: key.clone(),
            ns: pre.ns.clone(),
            name: pre.name.clone(),
            uid: old.uid.clone(),
            rv,
            labels,
            fields: pre.fields.clone(),
            full: Bytes::from(full),
            prefix_len: pre.prefix_len,
        });
        debug_assert_eq!(key, pre.key);
        self.rv = rv;
        self.objects[pre.res].insert(key, obj.clone());
        self.push_event(pre.res, EventKind::Modified, obj, Some(old));
        Ok(rv)
    }
}
