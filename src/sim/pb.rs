//! Kubernetes protobuf bodies (`application/vnd.kubernetes.protobuf`), converted to and from the
//! JSON the simulated server stores.
//!
//! On the wire an object is the four bytes `k8s\0` followed by a `runtime.Unknown` message whose
//! `typeMeta` names the kind and whose `raw` holds the typed message (e.g. `api.core.v1.ConfigMap`).
//! The messages' descriptors are built by `build.rs` from the upstream `generated.proto` files
//! in `proto/` (parsed by rust-protobuf's pure-Rust parser); the conversion walks a message
//! through rust-protobuf's reflection, field by field as the descriptor lists them, so no kind
//! has code of its own. Only the handful of apimachinery types whose JSON form is not their
//! message form are special: `Time`, `MicroTime`, `Duration`, `IntOrString`, `Quantity`,
//! `RawExtension`, `FieldsV1`.
//!
//! Go's encoder writes every non-pointer field, empty or not (`generateName: ""`,
//! `creationTimestamp: {}`), where its JSON encoder would leave them out (`omitempty`). The
//! conversion drops empty strings, empty messages, lists and maps, as the JSON encoder would;
//! numbers and booleans are kept, since a pointer field set to `0`/`false` (`replicas: 0`,
//! `automountServiceAccountToken: false`) means something.

use std::sync::OnceLock;

use base64::Engine as _;
use protobuf::descriptor::FileDescriptorSet;
use protobuf::reflect::{
    FileDescriptor, MessageDescriptor, ReflectFieldRef, ReflectValueBox, ReflectValueRef, RuntimeFieldType, RuntimeType,
};
use protobuf::{Message as _, MessageDyn};
use serde_json::{json, Map, Value};

use super::store::ApiError;

/// The protobuf media type.
pub(crate) const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// The envelope's magic prefix.
const MAGIC: &[u8] = b"k8s\0";

/// The descriptor set `build.rs` made of `proto/`.
static DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/k8s.fds"));

/// The files of `proto/`, loaded once.
fn files() -> &'static [FileDescriptor] {
    static FILES: OnceLock<Vec<FileDescriptor>> = OnceLock::new();
    FILES.get_or_init(|| {
        // Built from the repository's own files by build.rs: failing here is a build bug.
        FileDescriptorSet::parse_from_bytes(DESCRIPTORS)
            .ok()
            .and_then(|set| FileDescriptor::new_dynamic_fds(set.file, &[]).ok())
            .unwrap_or_default()
    })
}

/// The protobuf package of an API group version (`proto/`'s package names).
fn package_of(api_version: &str) -> Option<&'static str> {
    Some(match api_version {
        "v1" => "api.core.v1",
        "apps/v1" => "api.apps.v1",
        "batch/v1" => "api.batch.v1",
        "autoscaling/v1" => "api.autoscaling.v1",
        "rbac.authorization.k8s.io/v1" => "api.rbac.v1",
        "coordination.k8s.io/v1" => "api.coordination.v1",
        "policy/v1" => "api.policy.v1",
        "networking.k8s.io/v1" => "api.networking.v1",
        "scheduling.k8s.io/v1" => "api.scheduling.v1",
        _ => return None,
    })
}

/// A message by its full name.
fn message(full_name: &str) -> Option<MessageDescriptor> {
    let dotted = format!(".{full_name}");
    files().iter().find_map(|f| f.message_by_full_name(&dotted))
}

/// The message of a kind, if Kubernetes defines one (custom resources have none).
fn descriptor(api_version: &str, kind: &str) -> Option<MessageDescriptor> {
    message(&format!("{}.{kind}", package_of(api_version)?))
}

/// `runtime.Unknown`, the envelope.
fn unknown() -> Result<MessageDescriptor, ApiError> {
    message("apimachinery.pkg.runtime.Unknown")
        .ok_or_else(|| ApiError::new(500, "InternalError", "the protobuf descriptors are missing"))
}

/// Whether objects of this kind can be answered in protobuf.
pub(crate) fn supports(api_version: &str, kind: &str) -> bool {
    descriptor(api_version, kind).is_some()
}

/// Decode a request body: the envelope, then the typed message, into the object's JSON (with
/// `apiVersion` and `kind`). Malformed data is a 400, as on a real server.
pub(crate) fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let rest = body.strip_prefix(MAGIC).ok_or_else(|| {
        ApiError::bad_request(format!(
            "provided data does not appear to be a protobuf message, expected prefix {:?}",
            MAGIC
        ))
    })?;
    let env = unknown()?;
    let u = env
        .parse_from_bytes(rest)
        .map_err(|e| ApiError::bad_request(format!("unable to decode the protobuf envelope: {e}")))?;
    let text = |m: &dyn MessageDyn, d: &MessageDescriptor, name: &str| match get(d, m, name) {
        Some(ReflectValueRef::String(s)) => s.to_string(),
        _ => String::new(),
    };
    let (api_version, kind) = match get(&env, &*u, "typeMeta") {
        Some(ReflectValueRef::Message(tm)) => {
            let d = tm.descriptor_dyn();
            (text(&*tm, &d, "apiVersion"), text(&*tm, &d, "kind"))
        }
        _ => (String::new(), String::new()),
    };
    if kind.is_empty() {
        return Err(ApiError::bad_request(
            "Object 'Kind' is missing in the protobuf envelope",
        ));
    }
    if !text(&*u, &env, "contentEncoding").is_empty() {
        return Err(ApiError::bad_request(
            "unsupported contentEncoding in the protobuf envelope",
        ));
    }
    let content_type = text(&*u, &env, "contentType");
    if !content_type.is_empty() && content_type != MEDIA_TYPE {
        return Err(ApiError::bad_request(
            "unsupported contentType in the protobuf envelope",
        ));
    }
    let desc = descriptor(&api_version, &kind).ok_or_else(|| {
        ApiError::bad_request(format!(
            "no kind \"{kind}\" is registered for version \"{api_version}\" in the protobuf serializer"
        ))
    })?;
    let raw = match get(&env, &*u, "raw") {
        Some(ReflectValueRef::Bytes(b)) => b.to_vec(),
        _ => Vec::new(),
    };
    let msg = desc.parse_from_bytes(&raw).map_err(|e| {
        ApiError::bad_request(format!(
            "unable to decode {api_version}, Kind={kind} from protobuf: {e}"
        ))
    })?;
    let mut v = message_to_json(&*msg).map_err(ApiError::bad_request)?;
    let obj = v
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("the protobuf object is not an object"))?;
    // Go's encoder writes `generation: 0` for an unset one; the JSON one leaves it out.
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        if meta.get("generation").and_then(Value::as_i64) == Some(0) {
            meta.remove("generation");
        }
    }
    obj.insert("apiVersion".into(), json!(api_version));
    obj.insert("kind".into(), json!(kind));
    Ok(v)
}

/// Encode a stored object (JSON) as an envelope, or `None` if its kind has no message.
pub(crate) fn encode(api_version: &str, kind: &str, v: &Value) -> Option<Result<Vec<u8>, String>> {
    let desc = descriptor(api_version, kind)?;
    Some(json_to_message(&desc, v).and_then(|m| {
        let raw = m.write_to_bytes_dyn().map_err(|e| e.to_string())?;
        let envelope = json!({"typeMeta": {"apiVersion": api_version, "kind": kind},
            "contentEncoding": "", "contentType": ""});
        let env = unknown().map_err(|e| e.message)?;
        let mut u = json_to_message(&env, &envelope)?;
        set(&env, &mut *u, "raw", ReflectValueBox::Bytes(raw))?;
        let mut out = MAGIC.to_vec();
        out.extend(u.write_to_bytes_dyn().map_err(|e| e.to_string())?);
        Ok(out)
    }))
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::String(s) => s.is_empty(),
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Null => true,
        _ => false,
    }
}

fn message_to_json(m: &dyn MessageDyn) -> Result<Value, String> {
    let d = m.descriptor_dyn();
    if let Some(v) = special_to_json(&d, m)? {
        return Ok(v);
    }
    let mut out = Map::new();
    for f in d.fields() {
        let v = match f.get_reflect(m) {
            ReflectFieldRef::Optional(o) => match o.value() {
                Some(v) => value_to_json(v)?,
                None => continue,
            },
            ReflectFieldRef::Repeated(r) => Value::Array(r.into_iter().map(value_to_json).collect::<Result<_, _>>()?),
            ReflectFieldRef::Map(mp) => {
                let mut o = Map::new();
                for (k, v) in &mp {
                    let key = match k {
                        ReflectValueRef::String(s) => s.to_string(),
                        other => other.to_string(),
                    };
                    o.insert(key, value_to_json(v)?);
                }
                Value::Object(o)
            }
        };
        if !is_empty(&v) {
            out.insert(f.name().to_string(), v);
        }
    }
    Ok(Value::Object(out))
}

fn value_to_json(v: ReflectValueRef) -> Result<Value, String> {
    Ok(match v {
        ReflectValueRef::U32(x) => json!(x),
        ReflectValueRef::U64(x) => json!(x),
        ReflectValueRef::I32(x) => json!(x),
        ReflectValueRef::I64(x) => json!(x),
        ReflectValueRef::F32(x) => json!(x),
        ReflectValueRef::F64(x) => json!(x),
        ReflectValueRef::Bool(x) => json!(x),
        ReflectValueRef::String(s) => json!(s),
        ReflectValueRef::Bytes(b) => json!(base64::engine::general_purpose::STANDARD.encode(b)),
        ReflectValueRef::Enum(_, n) => json!(n),
        ReflectValueRef::Message(m) => message_to_json(&*m)?,
    })
}

/// A field of a message by name, as a reflected value.
fn get<'a>(d: &MessageDescriptor, m: &'a dyn MessageDyn, name: &str) -> Option<ReflectValueRef<'a>> {
    d.field_by_name(name)?.get_singular(m)
}

fn i64_of(v: Option<ReflectValueRef>) -> i64 {
    match v {
        Some(ReflectValueRef::I64(x)) => x,
        Some(ReflectValueRef::I32(x)) => i64::from(x),
        _ => 0,
    }
}

/// The JSON form of the apimachinery types that have one of their own.
fn special_to_json(d: &MessageDescriptor, m: &dyn MessageDyn) -> Result<Option<Value>, String> {
    let full = d.full_name();
    let Some(name) = full.strip_prefix("apimachinery.pkg.") else {
        return Ok(None);
    };
    Ok(Some(match name {
        "apis.meta.v1.Time" | "apis.meta.v1.MicroTime" => {
            let secs = i64_of(get(d, m, "seconds"));
            let nanos = i64_of(get(d, m, "nanos"));
            if secs == 0 && nanos == 0 {
                return Ok(Some(Value::Null));
            }
            let t = chrono::DateTime::from_timestamp(secs, u32::try_from(nanos).unwrap_or(0))
                .ok_or_else(|| format!("time out of range: {secs}s"))?;
            let fmt = if name.ends_with("MicroTime") {
                chrono::SecondsFormat::Micros
            } else {
                chrono::SecondsFormat::Secs
            };
            json!(t.to_rfc3339_opts(fmt, true))
        }
        "apis.meta.v1.Duration" => json!(go_duration(i64_of(get(d, m, "duration")))),
        "util.intstr.IntOrString" => {
            if i64_of(get(d, m, "type")) == 1 {
                match get(d, m, "strVal") {
                    Some(ReflectValueRef::String(s)) => json!(s),
                    _ => json!(""),
                }
            } else {
                json!(i64_of(get(d, m, "intVal")))
            }
        }
        "api.resource.Quantity" => match get(d, m, "string") {
            Some(ReflectValueRef::String(s)) => json!(s),
            _ => Value::Null,
        },
        "runtime.RawExtension" | "apis.meta.v1.FieldsV1" => {
            let field = if name.ends_with("FieldsV1") { "Raw" } else { "raw" };
            match get(d, m, field) {
                Some(ReflectValueRef::Bytes(b)) if !b.is_empty() => {
                    serde_json::from_slice(b).map_err(|e| format!("{full} does not hold JSON: {e}"))?
                }
                _ => Value::Null,
            }
        }
        _ => return Ok(None),
    }))
}

/// Go's `time.Duration.String()` for whole units (`1h0m0s`, `90s`, `1.5s`).
fn go_duration(ns: i64) -> String {
    if ns == 0 {
        return "0s".into();
    }
    let sign = if ns < 0 { "-" } else { "" };
    let ns = ns.unsigned_abs();
    if ns < 1_000_000_000 {
        return format!("{sign}{}ms", ns as f64 / 1e6);
    }
    let (h, m) = (ns / 3_600_000_000_000, (ns / 60_000_000_000) % 60);
    let s = (ns % 60_000_000_000) as f64 / 1e9;
    match (h, m) {
        (0, 0) => format!("{sign}{s}s"),
        (0, _) => format!("{sign}{m}m{s}s"),
        _ => format!("{sign}{h}h{m}m{s}s"),
    }
}

/// Parse Go's duration syntax (`1h30m`, `90s`, `1.5s`, `100ms`) into nanoseconds.
fn parse_go_duration(s: &str) -> Result<i64, String> {
    let bad = || format!("invalid duration {s:?}");
    let (neg, mut rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s),
    };
    if rest == "0" {
        return Ok(0);
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(bad)?;
        let n: f64 = rest[..num_end].parse().map_err(|_| bad())?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1.0,
            "us" | "µs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 6e10,
            "h" => 3.6e12,
            _ => return Err(bad()),
        };
        total += n * scale;
        rest = &rest[unit_end..];
    }
    #[allow(clippy::cast_possible_truncation)]
    let ns = total.round() as i64;
    Ok(if neg { -ns } else { ns })
}

fn json_to_message(d: &MessageDescriptor, v: &Value) -> Result<Box<dyn MessageDyn>, String> {
    let mut m = d.new_instance();
    if special_from_json(d, &mut *m, v)? {
        return Ok(m);
    }
    let Some(obj) = v.as_object() else {
        return Err(format!("{}: an object expected, got {v}", d.full_name()));
    };
    for (key, val) in obj {
        // Fields the message does not have (`kind`, `apiVersion`) are left out, as Go's
        // protobuf encoder has no place for them either.
        let Some(f) = d.field_by_name(key) else { continue };
        if val.is_null() {
            continue;
        }
        match f.runtime_field_type() {
            RuntimeFieldType::Singular(t) => {
                let b = value_from_json(&t, val)?;
                f.set_singular_field(&mut *m, b);
            }
            RuntimeFieldType::Repeated(t) => {
                let items = val.as_array().ok_or_else(|| format!("{key}: a list expected"))?;
                let mut r = f.mut_repeated(&mut *m);
                for item in items {
                    r.push(value_from_json(&t, item)?);
                }
            }
            RuntimeFieldType::Map(kt, vt) => {
                let entries = val.as_object().ok_or_else(|| format!("{key}: a map expected"))?;
                let mut mp = f.mut_map(&mut *m);
                for (k, item) in entries {
                    mp.insert(value_from_json(&kt, &json!(k))?, value_from_json(&vt, item)?);
                }
            }
        }
    }
    Ok(m)
}

fn value_from_json(t: &RuntimeType, v: &Value) -> Result<ReflectValueBox, String> {
    let int = || v.as_i64().ok_or_else(|| format!("an integer expected, got {v}"));
    let uint = || {
        v.as_u64()
            .ok_or_else(|| format!("an unsigned integer expected, got {v}"))
    };
    let float = || v.as_f64().ok_or_else(|| format!("a number expected, got {v}"));
    Ok(match t {
        RuntimeType::I32 => ReflectValueBox::I32(i32::try_from(int()?).map_err(|e| e.to_string())?),
        RuntimeType::I64 => ReflectValueBox::I64(int()?),
        RuntimeType::U32 => ReflectValueBox::U32(u32::try_from(uint()?).map_err(|e| e.to_string())?),
        RuntimeType::U64 => ReflectValueBox::U64(uint()?),
        #[allow(clippy::cast_possible_truncation)]
        RuntimeType::F32 => ReflectValueBox::F32(float()? as f32),
        RuntimeType::F64 => ReflectValueBox::F64(float()?),
        RuntimeType::Bool => ReflectValueBox::Bool(v.as_bool().ok_or_else(|| format!("a boolean expected, got {v}"))?),
        RuntimeType::String => ReflectValueBox::String(match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        }),
        RuntimeType::VecU8 => {
            let s = v.as_str().ok_or_else(|| format!("base64 data expected, got {v}"))?;
            ReflectValueBox::Bytes(
                base64::engine::general_purpose::STANDARD
                    .decode(s)
                    .map_err(|e| e.to_string())?,
            )
        }
        RuntimeType::Enum(e) => ReflectValueBox::Enum(e.clone(), i32::try_from(int()?).map_err(|e| e.to_string())?),
        RuntimeType::Message(d) => ReflectValueBox::Message(json_to_message(d, v)?),
    })
}

/// Set a field of a special message; `Ok(false)` when `name` is not one.
fn set(d: &MessageDescriptor, m: &mut dyn MessageDyn, name: &str, v: ReflectValueBox) -> Result<(), String> {
    let f = d
        .field_by_name(name)
        .ok_or_else(|| format!("{} has no field {name}", d.full_name()))?;
    f.set_singular_field(m, v);
    Ok(())
}

/// Fill a message of a type with a JSON form of its own; `Ok(false)` for other types.
fn special_from_json(d: &MessageDescriptor, m: &mut dyn MessageDyn, v: &Value) -> Result<bool, String> {
    let full = d.full_name().to_string();
    let Some(name) = full.strip_prefix("apimachinery.pkg.") else {
        return Ok(false);
    };
    match name {
        "apis.meta.v1.Time" | "apis.meta.v1.MicroTime" => {
            let s = v.as_str().ok_or_else(|| format!("a time expected, got {v}"))?;
            let t = chrono::DateTime::parse_from_rfc3339(s).map_err(|e| format!("{s:?}: {e}"))?;
            set(d, m, "seconds", ReflectValueBox::I64(t.timestamp()))?;
            let nanos = i32::try_from(t.timestamp_subsec_nanos()).map_err(|e| e.to_string())?;
            set(d, m, "nanos", ReflectValueBox::I32(nanos))?;
        }
        "apis.meta.v1.Duration" => {
            let s = v.as_str().ok_or_else(|| format!("a duration expected, got {v}"))?;
            set(d, m, "duration", ReflectValueBox::I64(parse_go_duration(s)?))?;
        }
        "util.intstr.IntOrString" => match v {
            Value::String(s) => {
                set(d, m, "type", ReflectValueBox::I64(1))?;
                set(d, m, "strVal", ReflectValueBox::String(s.clone()))?;
            }
            _ => {
                let n = v
                    .as_i64()
                    .ok_or_else(|| format!("an int or a string expected, got {v}"))?;
                set(d, m, "type", ReflectValueBox::I64(0))?;
                set(
                    d,
                    m,
                    "intVal",
                    ReflectValueBox::I32(i32::try_from(n).map_err(|e| e.to_string())?),
                )?;
            }
        },
        "api.resource.Quantity" => {
            let s = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            set(d, m, "string", ReflectValueBox::String(s))?;
        }
        "runtime.RawExtension" | "apis.meta.v1.FieldsV1" => {
            let field = if name.ends_with("FieldsV1") { "Raw" } else { "raw" };
            let raw = serde_json::to_vec(v).map_err(|e| e.to_string())?;
            set(d, m, field, ReflectValueBox::Bytes(raw))?;
        }
        _ => return Ok(false),
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_and_print_like_go() {
        assert_eq!(go_duration(3_600_000_000_000), "1h0m0s");
        assert_eq!(go_duration(90_000_000_000), "1m30s");
        assert_eq!(go_duration(1_500_000_000), "1.5s");
        assert_eq!(parse_go_duration("1h30m").ok(), Some(5_400_000_000_000));
        assert_eq!(parse_go_duration("100ms").ok(), Some(100_000_000));
        assert!(parse_go_duration("1x").is_err());
        assert!(parse_go_duration("h").is_err());
    }

    #[test]
    fn a_configmap_goes_round_trip() {
        let cm = json!({"metadata": {"name": "c", "namespace": "n", "labels": {"a": "b"},
            "creationTimestamp": "2026-01-02T03:04:05Z"}, "data": {"k": "v"}, "binaryData": {"b": "AAE="}});
        let bytes = encode("v1", "ConfigMap", &cm)
            .expect("a kind with a message")
            .expect("encodes");
        let back = decode(&bytes).expect("decodes");
        let mut want = cm.clone();
        want["apiVersion"] = json!("v1");
        want["kind"] = json!("ConfigMap");
        assert_eq!(back, want);
    }

    #[test]
    fn a_deployment_keeps_ints_or_strings_and_quantities() {
        let d = json!({"metadata": {"name": "d"}, "spec": {"replicas": 0,
            "selector": {"matchLabels": {"app": "d"}},
            "strategy": {"rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 1}},
            "template": {"metadata": {"labels": {"app": "d"}}, "spec": {"containers": [{"name": "c",
            "image": "nginx", "resources": {"limits": {"cpu": "500m"}}}]}}}});
        let bytes = encode("apps/v1", "Deployment", &d).expect("message").expect("encodes");
        let back = decode(&bytes).expect("decodes");
        assert_eq!(back["spec"], d["spec"]);
    }

    #[test]
    fn bad_bodies_are_400s() {
        for body in [&b"{}"[..], b"k8s\0\xff\xff", b"k8s\0"] {
            let e = decode(body).expect_err("refused");
            assert_eq!(e.code, 400, "{body:?}: {}", e.message);
        }
        assert!(encode("example.com/v1", "Thing", &json!({})).is_none());
    }
}
