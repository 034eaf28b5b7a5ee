//! One stored object version, the events of the history, and building objects from request bodies.

use crate::sim::util::at_dotted;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::super::ResourceDef;
use crate::selector::{FieldSelector, LabelSelector, ShardField, ShardSelector};

use super::ApiError;

/// One stored object version: its serialized JSON plus the small index a server needs.
#[derive(Debug)]
pub(crate) struct Obj {
    /// Storage key: `namespace/name` for namespaced resources, `name` otherwise (etcd's order).
    pub key: String,
    pub ns: String,
    pub name: String,
    /// `metadata.uid`: a shard selector may hash it.
    pub uid: String,
    pub rv: u64,
    pub labels: BTreeMap<String, String>,
    /// Selectable fields besides `metadata.name`/`metadata.namespace`.
    pub fields: Vec<(&'static str, String)>,
    /// The object with `kind` and `apiVersion` first: `{"kind":…,"apiVersion":…,<rest>`.
    pub full: Bytes,
    /// Length of the `{"kind":…,"apiVersion":…,` prefix; `{` + `full[prefix_len..]` is the
    /// object as a LIST item (the API server leaves kind/apiVersion out of list items).
    pub prefix_len: usize,
}

impl Obj {
    /// The object as a LIST item (without `kind`/`apiVersion`), appended to `out`.
    pub fn write_item(&self, out: &mut Vec<u8>) {
        out.push(b'{');
        out.extend_from_slice(&self.full[self.prefix_len..]);
    }

    /// The object as `meta.k8s.io/v1` `PartialObjectMetadata` (what a client asking with
    /// `Accept: application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1` receives).
    pub fn write_partial(&self, out: &mut Vec<u8>) {
        let metadata = self.value().get("metadata").cloned().unwrap_or(Value::Null);
        out.extend_from_slice(br#"{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":"#);
        out.extend_from_slice(metadata.to_string().as_bytes());
        out.push(b'}');
    }

    /// The parsed object.
    pub fn value(&self) -> Value {
        serde_json::from_slice(&self.full).unwrap_or(Value::Null)
    }

    /// The value of a selectable field (`None` if the resource does not have it).
    pub fn field(&self, path: &str) -> Option<String> {
        match path {
            "metadata.name" => Some(self.name.clone()),
            "metadata.namespace" => Some(self.ns.clone()),
            _ => self.fields.iter().find(|(p, _)| *p == path).map(|(_, v)| v.clone()),
        }
    }

    /// Whether both selectors match.
    pub fn matches(&self, labels: &LabelSelector, fields: &FieldSelector) -> bool {
        labels.matches(&self.labels) && fields.matches(|p| self.field(p))
    }

    /// Whether the object is in the shard (KEP-5866).
    pub fn in_shard(&self, shard: &ShardSelector) -> bool {
        shard.matches(|f| match f {
            ShardField::Uid => Some(self.uid.as_str()),
            ShardField::Namespace => Some(self.ns.as_str()),
        })
    }
}

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventKind {
    Added,
    Modified,
    Deleted,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Added => "ADDED",
            EventKind::Modified => "MODIFIED",
            EventKind::Deleted => "DELETED",
        }
    }
}

/// One entry of the history.
#[derive(Debug)]
pub(crate) struct Event {
    pub rv: u64,
    pub res: usize,
    pub kind: EventKind,
    /// The new state; for a delete, the last state stamped with the deletion's RV.
    pub obj: Arc<Obj>,
    /// The state before (None for an add).
    pub prev: Option<Arc<Obj>>,
    pub at: Instant,
}

/// The storage key of an object.
pub(crate) fn key_of(def: &ResourceDef, ns: &str, name: &str) -> String {
    if def.namespaced {
        // Built by hand: one per request and write (`format!` is several times slower).
        let mut k = String::with_capacity(ns.len() + 1 + name.len());
        k.push_str(ns);
        k.push('/');
        k.push_str(name);
        k
    } else {
        name.to_string()
    }
}

pub(super) fn random_suffix() -> String {
    const CH: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5)
        .map(|_| char::from(CH[rand::random_range(0..CH.len())]))
        .collect()
}

pub(super) fn meta_mut(v: &mut Value) -> Result<&mut Map<String, Value>, ApiError> {
    let obj = v
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("the body must be a JSON object"))?;
    let meta = obj.entry("metadata").or_insert_with(|| json!({}));
    if !meta.is_object() {
        return Err(ApiError::bad_request("metadata must be an object"));
    }
    meta.as_object_mut()
        .ok_or_else(|| ApiError::bad_request("metadata must be an object"))
}

pub(super) fn resolve_ns(
    def: &ResourceDef,
    path_ns: Option<&str>,
    meta: &Map<String, Value>,
) -> Result<String, ApiError> {
    if !def.namespaced {
        return Ok(String::new());
    }
    let body_ns = meta.get("namespace").and_then(Value::as_str).filter(|s| !s.is_empty());
    match (path_ns, body_ns) {
        (Some(p), Some(b)) if p != b => Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
        (Some(p), _) => Ok(p.to_string()),
        (None, Some(b)) => Ok(b.to_string()),
        (None, None) => Ok("default".to_string()),
    }
}

pub(super) fn check_name(def: &ResourceDef, name: &str) -> Result<(), ApiError> {
    let ok = name.len() <= 253
        && !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.chars().last().is_some_and(|c| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(
            def,
            name,
            &format!("metadata.name: Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"),
        ))
    }
}

/// RFC 7386 JSON merge patch.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    let Some(p) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    if let Some(t) = target.as_object_mut() {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// The merge key of the lists that a strategic merge patch merges item by item (the Go types'
/// `patchStrategy:"merge"` fields); every other list is replaced, as by a JSON merge patch.
/// Keyed by field name, which is unambiguous for the built-in kinds the server serves.
fn list_merge_key(field: &str, items: &[Value]) -> Option<&'static str> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "resourceClaims"
        | "schedulingGates" => "name",
        "ownerReferences" => "uid",
        // Container ports merge by containerPort, Service ports by port.
        "ports" if items.iter().all(|i| i.get("containerPort").is_some()) => "containerPort",
        "ports" => "port",
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        "conditions" => "type",
        "hostAliases" => "ip",
        _ => return None,
    })
}

/// A patch value without the strategic-merge directives (`$patch`, `$retainKeys`, …).
fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

/// A strategic merge patch, as `kubectl apply`, `edit` and `label` send them: a JSON merge
/// patch, except that the lists of [`list_merge_key`] merge item by item (`$patch: delete`
/// removes one), `$retainKeys` drops the keys it does not list, `$deleteFromPrimitiveList/f`
/// removes values and `$patch: replace` replaces. `$setElementOrder` is ignored (the order
/// of the stored list is kept, new items go last).
pub(crate) fn strategic_merge_patch(target: &mut Value, patch: &Value) {
    let Some(p) = patch.as_object() else {
        *target = strip_directives(patch);
        return;
    };
    if p.get("$patch").and_then(Value::as_str) == Some("replace") {
        *target = strip_directives(patch);
        return;
    }
    if !target.is_object() {
        *target = json!({});
    }
    let Some(t) = target.as_object_mut() else { return };
    for (k, v) in p {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(cur)), Some(gone)) = (t.get_mut(field), v.as_array()) {
                cur.retain(|x| !gone.contains(x));
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        if v.is_null() {
            t.remove(k);
            continue;
        }
        match (t.get_mut(k), v) {
            (Some(Value::Array(cur)), Value::Array(items)) => match list_merge_key(k, items) {
                Some(key) => merge_list(cur, items, key),
                None => *cur = items.iter().map(strip_directives).collect(),
            },
            (Some(existing @ Value::Object(_)), Value::Object(_)) => strategic_merge_patch(existing, v),
            _ => {
                let mut fresh = Value::Null;
                strategic_merge_patch(&mut fresh, v);
                t.insert(k.clone(), fresh);
            }
        }
    }
    if let Some(keep) = p.get("$retainKeys").and_then(Value::as_array) {
        t.retain(|k, _| keep.iter().any(|x| x.as_str() == Some(k)));
    }
}

fn merge_list(cur: &mut Vec<Value>, items: &[Value], key: &str) {
    for item in items {
        let id = item.get(key);
        let pos = id.and_then(|id| cur.iter().position(|c| c.get(key) == Some(id)));
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        match (pos, delete) {
            (Some(i), true) => {
                cur.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => strategic_merge_patch(&mut cur[i], item),
            (None, false) => cur.push(strip_directives(item)),
        }
    }
}

/// Serialize an object (kind/apiVersion first) and extract its index.
pub(crate) fn build_obj(def: &ResourceDef, key: String, v: Value) -> Result<Obj, ApiError> {
    build_obj_parsed(def, key, v, false).map(|(obj, _)| obj)
}

/// [`build_obj`], with `keep`, also giving back the object as its bytes parse (`None` when
/// it has no fields besides kind and apiVersion): the in-process server keeps it for the
/// harness.
pub(crate) fn build_obj_parsed(
    def: &ResourceDef,
    key: String,
    mut v: Value,
    keep: bool,
) -> Result<(Obj, Option<Value>), ApiError> {
    let obj = v
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("the body must be a JSON object"))?;
    obj.remove("kind");
    obj.remove("apiVersion");
    let meta = obj.get("metadata");
    let s = |p: &str| {
        meta.and_then(|m| m.get(p))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let rv = meta
        .and_then(|m| m.get("resourceVersion"))
        .and_then(Value::as_str)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    let (ns, name, uid) = (s("namespace"), s("name"), s("uid"));
    let labels = meta
        .and_then(|m| m.get("labels"))
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default();
    let mut fields = Vec::new();
    for path in def.extra_fields() {
        let val = at_dotted(&v, path).map(|x| match x {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        });
        fields.push((*path, val.unwrap_or_default()));
    }
    // `{"kind":…,"apiVersion":…,` then the rest of `v`, serialized in place: `v` is `{…}`
    // (with at least `metadata` inside), and its opening brace becomes that comma.
    let bad = |e: serde_json::Error| ApiError::bad_request(e.to_string());
    let mut full = Vec::with_capacity(1024);
    full.extend_from_slice(br#"{"kind":"#);
    serde_json::to_writer(&mut full, &def.kind).map_err(bad)?;
    full.extend_from_slice(br#","apiVersion":"#);
    serde_json::to_writer(&mut full, &def.api_version()).map_err(bad)?;
    let brace = full.len();
    serde_json::to_writer(&mut full, &v).map_err(bad)?;
    debug_assert_eq!(full.get(brace), Some(&b'{'));
    if let Some(b) = full.get_mut(brace) {
        *b = b',';
    }
    // Kept for the object's life (a million of them in the large benchmarks): no spare room.
    full.shrink_to_fit();
    // What `full` parses to: `v` with kind and apiVersion back (a map's order is its keys').
    let parsed = match v {
        Value::Object(mut m) if keep && !m.is_empty() => {
            m.insert("kind".into(), Value::String(def.kind.clone()));
            m.insert("apiVersion".into(), Value::String(def.api_version()));
            Some(Value::Object(m))
        }
        _ => None,
    };
    let obj = Obj {
        key,
        ns,
        name,
        uid,
        rv,
        labels,
        fields,
        full: Bytes::from(full),
        prefix_len: brace + 1,
    };
    Ok((obj, parsed))
}
