//! The HTTP side of the simulated server: routing, discovery, LIST, WATCH, GET and writes.
//!
//! Read top to bottom: `serve` accepts connections, `handle` routes a request, then one
//! function per verb: `list` and `watch` in their files, GET and writes here. Responses are
//! built in `response`, discovery documents in `discovery`. Storage lives in `store`; the
//! server never mutates objects itself.

mod discovery;
mod list;
mod response;
mod watch;

use crate::sim::util::JsonAt as _;
use crate::util::Locked;
use std::convert::Infallible;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;

use super::pb;
use super::store::{merge_patch, strategic_merge_patch, ApiError, Obj, State};
use super::util::parse_query;
use super::{ResourceDef, Shared};
use discovery::{
    api_group, api_groups, api_versions, has_group_version, openapi_gv, openapi_root, resource_list, version_body,
};
use list::list;
pub(crate) use list::{decode_continue, encode_continue};
use response::{
    failure_response, full_response, json_response, not_acceptable, not_found_path, protobuf_response, status_response,
    text_response,
};
use watch::watch;

pub(super) type Body = UnsyncBoxBody<Bytes, io::Error>;
pub(super) type Resp = Response<Body>;

/// Accept connections until the runtime shuts down.
pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::debug!("sim accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(handle(shared, req).await) }
            });
            if let Err(e) = http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await {
                tracing::trace!("sim connection ended: {e}");
            }
        });
    }
}

/// A query string, decoded.
pub(super) struct Query(Vec<(String, String)>);

impl Query {
    fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
    fn str(&self, name: &str) -> &str {
        self.get(name).unwrap_or("")
    }
    fn flag(&self, name: &str) -> bool {
        matches!(self.get(name), Some("true" | "1"))
    }
}

/// Which resource (and object) a path names.
pub(super) struct Target {
    res: usize,
    def: Arc<ResourceDef>,
    ns: Option<String>,
    name: Option<String>,
    status: bool,
    /// The `/scale` subresource (autoscaling/v1 `Scale`) of a resource that has one.
    scale: bool,
}

/// What the client accepts (`Accept`), as far as the server has a choice.
#[derive(Debug, Clone, Copy)]
pub(super) struct Accept {
    /// Protobuf comes before any JSON entry.
    prefers_protobuf: bool,
    /// JSON is acceptable (listed, `*/*`, `application/*`, or no header).
    json: bool,
    /// `application/json;as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1` comes first: the
    /// metadata-only form (kube's `list_metadata`/`watch_metadata`, client-go's metadata client).
    pub(super) partial: bool,
    /// The revision of a lagging watch cache this request reaches ([`LaggingCache`]).
    pub(super) cache_at: Option<u64>,
}

/// A request extension for the in-process server: the request reaches an API server whose
/// watch cache is behind, at this revision (an HA server catching up). A streaming list
/// answers the state at that revision (then the events after it); reads from etcd are not
/// affected. The controller test harness's time travel (`crate::testing`) sets it.
#[cfg(feature = "testing")]
#[derive(Debug, Clone, Copy)]
pub(crate) struct LaggingCache(pub u64);

impl Accept {
    fn parse(header: &str) -> Self {
        let mut out = Accept {
            prefers_protobuf: false,
            json: header.trim().is_empty(),
            partial: false,
            cache_at: None,
        };
        for entry in header.split(',') {
            let mut parts = entry.split(';').map(str::trim);
            let media = parts.next().unwrap_or("");
            let params: Vec<String> = parts.map(|p| p.replace(' ', "")).collect();
            // `q=0` means "not acceptable".
            if params.iter().any(|p| p == "q=0") {
                continue;
            }
            let partial = params
                .iter()
                .any(|p| p == "as=PartialObjectMetadata" || p == "as=PartialObjectMetadataList")
                && params.iter().any(|p| p == "g=meta.k8s.io");
            if media == "application/json" && partial && !out.json && !out.prefers_protobuf {
                out.partial = true;
            }
            // No protobuf form of the metadata-only kinds here: the JSON entry after it is used.
            if media == pb::MEDIA_TYPE && params.iter().any(|p| p.starts_with("as=")) {
                continue;
            }
            match media {
                pb::MEDIA_TYPE if !out.json => out.prefers_protobuf = true,
                "application/json" | "application/*" | "*/*" => out.json = true,
                _ => {}
            }
        }
        out
    }
}

/// Serve one request without a socket: the controller test harness's `kube::Client` calls
/// the server in-process, on the test's own runtime and clock.
#[cfg(feature = "testing")]
pub(crate) async fn handle_in_process(shared: Arc<Shared>, req: Request<http_body_util::Full<Bytes>>) -> Resp {
    handle(shared, req).await
}

async fn handle<B>(shared: Arc<Shared>, req: Request<B>) -> Resp
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    let delay = shared.faults.lock().delay;
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .is_some_and(|v| v.as_bytes().starts_with(b"Bearer "));
    if bearer {
        shared.counters.bearer_requests.fetch_add(1, Ordering::Relaxed);
    }
    if let Some(agent) = req.headers().get(header::USER_AGENT).and_then(|v| v.to_str().ok()) {
        let mut seen = shared.user_agents.locked();
        if seen.len() < super::MAX_USER_AGENTS && !seen.contains(agent) {
            seen.insert(agent.to_owned());
        }
    }
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = Query(parse_query(req.uri().query()));
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let accept_header = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let accept_protobuf = accept_header.contains("protobuf");
    #[allow(unused_mut)]
    let mut accept = Accept::parse(accept_header);
    #[cfg(feature = "testing")]
    {
        accept.cache_at = req.extensions().get::<LaggingCache>().map(|l| l.0);
    }
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();

    let resp = match segs.as_slice() {
        ["version"] => json_response(StatusCode::OK, version_body(&shared)),
        ["healthz" | "readyz" | "livez"] => text_response("ok"),
        ["api"] => json_response(StatusCode::OK, api_versions()),
        // An empty OpenAPI v2 document: older kubectl validates against it and finds no schema
        // for any kind, so it skips client-side validation. (An empty protobuf message is a
        // valid empty `openapi_v2.Document`.)
        ["openapi", "v2"] if accept_protobuf => {
            let mut r = full_response(StatusCode::OK, Bytes::new());
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            r
        }
        ["openapi", "v2"] => json_response(
            StatusCode::OK,
            json!({"swagger": "2.0", "info": {"title": "Kubernetes (durable-informer sim)", "version": "v1.33.0"}, "paths": {}}),
        ),
        ["openapi", "v3"] => json_response(StatusCode::OK, openapi_root(&shared.lock())),
        ["openapi", "v3", "api", "v1"] => json_response(StatusCode::OK, openapi_gv(&shared.lock(), "", "v1")),
        ["openapi", "v3", "apis", g, v] => json_response(StatusCode::OK, openapi_gv(&shared.lock(), g, v)),
        ["apis"] => json_response(StatusCode::OK, api_groups(&shared.lock())),
        ["api", "v1"] => json_response(StatusCode::OK, resource_list(&shared.lock(), "", "v1")),
        ["apis", g] => match api_group(&shared.lock(), g) {
            Some(v) => json_response(StatusCode::OK, v),
            None => not_found_path(),
        },
        ["apis", g, v] if has_group_version(&shared.lock(), g, v) => {
            let body = resource_list(&shared.lock(), g, v);
            json_response(StatusCode::OK, body)
        }
        _ => {
            let target = route(&shared.lock(), &segs);
            match target {
                Some(t) => {
                    let body = if matches!(method, Method::POST | Method::PUT | Method::PATCH | Method::DELETE) {
                        match req.into_body().collect().await {
                            Ok(b) => b.to_bytes(),
                            Err(e) => return status_response(&shared, &ApiError::bad_request(e.to_string())),
                        }
                    } else {
                        Bytes::new()
                    };
                    resource_request(&shared, method, t, &query, &content_type, &body, accept).await
                }
                None => not_found_path(),
            }
        }
    };
    count_bytes(&shared, resp)
}

fn count_bytes(shared: &Shared, resp: Resp) -> Resp {
    use hyper::body::Body as _;
    if let Some(n) = resp.body().size_hint().exact() {
        shared.counters.bytes_served.fetch_add(n, Ordering::Relaxed);
    }
    resp
}

fn route(st: &State, segs: &[&str]) -> Option<Target> {
    let (group, version, rest) = match segs {
        ["api", "v1", rest @ ..] => ("", "v1", rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let pick = |res: usize, ns: Option<&str>, name: Option<&&str>, sub: Option<&&str>| {
        let def = st.resources.get(res)?.clone();
        let (status, scale) = match sub {
            None => (false, false),
            Some(&"status") => (true, false),
            Some(&"scale") if def.has_scale() => (false, true),
            Some(_) => return None,
        };
        if def.namespaced == ns.is_none() && (name.is_some() || (!def.namespaced && ns.is_some())) {
            return None;
        }
        Some(Target {
            res,
            def,
            ns: ns.map(str::to_string),
            name: name.map(|s| (*s).to_string()),
            status,
            scale,
        })
    };
    if rest.first() == Some(&"namespaces") && rest.len() >= 3 && rest.len() <= 5 {
        if let Some(res) = st.find_gvr(group, version, rest[2]) {
            if st.resources[res].namespaced {
                return pick(res, Some(rest[1]), rest.get(3), rest.get(4));
            }
        }
    }
    if rest.is_empty() || rest.len() > 3 {
        return None;
    }
    let res = st.find_gvr(group, version, rest[0])?;
    pick(res, None, rest.get(1), rest.get(2))
}

async fn resource_request(
    shared: &Arc<Shared>,
    method: Method,
    t: Target,
    q: &Query,
    content_type: &str,
    body: &Bytes,
    accept: Accept,
) -> Resp {
    let is_watch = method == Method::GET && t.name.is_none() && q.flag("watch");
    let is_list = method == Method::GET && t.name.is_none() && !is_watch;
    let c = &shared.counters;
    if is_list {
        c.list_requests.fetch_add(1, Ordering::Relaxed);
    } else if is_watch {
        c.watch_requests.fetch_add(1, Ordering::Relaxed);
    } else if method == Method::GET {
        c.get_requests.fetch_add(1, Ordering::Relaxed);
    } else {
        c.write_requests.fetch_add(1, Ordering::Relaxed);
    }
    if let Some(f) = shared.faults.take_failure(is_list, is_watch) {
        return failure_response(shared, f);
    }
    if (t.status || t.scale) && !matches!(method, Method::GET | Method::PUT | Method::PATCH) {
        return status_response(shared, &method_not_allowed());
    }
    let ct = content_type.split(';').next().unwrap_or("").trim();
    let protobuf_body = ct == pb::MEDIA_TYPE && !body.is_empty();
    if !body.is_empty()
        && !protobuf_body
        && (ct.contains("protobuf")
            || ct.contains("cbor")
            || ct.contains("yaml") && ct != "application/apply-patch+yaml")
    {
        return status_response(
            shared,
            &ApiError::new(415, "UnsupportedMediaType", format!("the body of the request was in an unknown format - accepted media types include: application/json, {}, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml (got {ct})", pb::MEDIA_TYPE)),
        );
    }
    // A protobuf-only client of a kind without a protobuf message gets what a real server
    // answers for custom resources: 406.
    // Named only where protobuf may be read or written (a JSON client never needs them).
    let protobuf_wanted = !accept.json || accept.prefers_protobuf || protobuf_body;
    let (answer_api_version, answer_kind) = match (protobuf_wanted, t.scale) {
        (false, _) => (String::new(), String::new()),
        (true, true) => ("autoscaling/v1".to_string(), "Scale".to_string()),
        (true, false) => (t.def.api_version(), t.def.kind.clone()),
    };
    let protobuf_ok = protobuf_wanted && pb::supports(&answer_api_version, &answer_kind);
    if !accept.json && !protobuf_ok && !is_list && !is_watch {
        return not_acceptable();
    }
    // Delete options are ignored (deletes are immediate), so their format does not matter.
    let parse = |body: &Bytes| {
        if protobuf_body && method != Method::DELETE {
            parse_protobuf(body, &answer_api_version, &answer_kind)
        } else {
            parse_body(body)
        }
    };
    if t.scale {
        let result = scale(shared, &method, &t, content_type, body, parse);
        return match result {
            Ok(v) => object_response(StatusCode::OK, &v, "autoscaling/v1", "Scale", accept),
            Err(e) => status_response(shared, &e),
        };
    }
    let result = match (&method, &t.name) {
        (&Method::GET, None) if is_watch => return watch(shared, &t, q, accept.partial, accept.cache_at).await,
        (&Method::GET, None) => return list(shared, &t, q, accept.partial).await,
        (&Method::GET, Some(name)) => shared
            .lock()
            .get(t.res, t.ns.as_deref(), name)
            .map(|o| (StatusCode::OK, o)),
        (&Method::POST, None) => parse(body)
            .and_then(|v| write(shared, |st| st.create(t.res, t.ns.as_deref(), v)).map(|o| (StatusCode::CREATED, o))),
        (&Method::PUT, Some(name)) => parse(body).and_then(|v| {
            write(shared, |st| st.update(t.res, t.ns.as_deref(), name, v, t.status)).map(|o| (StatusCode::OK, o))
        }),
        (&Method::PATCH, Some(name)) => patch(shared, &t, name, content_type, body),
        (&Method::DELETE, Some(name)) => {
            // 202 while finalizers hold the object, as the real server answers.
            write(shared, |st| st.delete(t.res, t.ns.as_deref(), name)).map(|(o, stays)| {
                let code = if stays { StatusCode::ACCEPTED } else { StatusCode::OK };
                (code, o)
            })
        }
        _ => Err(method_not_allowed()),
    };
    match result {
        Ok((code, obj)) if accept.prefers_protobuf && protobuf_ok => {
            object_response(code, &obj.value(), &answer_api_version, &answer_kind, accept)
        }
        Ok((code, obj)) if accept.partial => {
            let mut out = Vec::new();
            obj.write_partial(&mut out);
            full_response(code, Bytes::from(out))
        }
        Ok((code, obj)) => full_response(code, obj.full.clone()),
        Err(e) => status_response(shared, &e),
    }
}

/// An object in the format the client prefers: protobuf when it asks for it first and the kind
/// has a message, JSON otherwise.
fn object_response(code: StatusCode, v: &Value, api_version: &str, kind: &str, accept: Accept) -> Resp {
    if accept.prefers_protobuf {
        match pb::encode(api_version, kind, v) {
            Some(Ok(bytes)) => return protobuf_response(code, Bytes::from(bytes)),
            Some(Err(e)) => tracing::warn!("sim: cannot encode {kind} as protobuf, answering JSON: {e}"),
            None => {}
        }
    }
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        o.insert("apiVersion".into(), json!(api_version));
        o.insert("kind".into(), json!(kind));
    }
    json_response(code, v)
}

/// A protobuf body, decoded; its kind must be the one the path names.
fn parse_protobuf(body: &Bytes, api_version: &str, kind: &str) -> Result<Value, ApiError> {
    let v = pb::decode(body)?;
    let got_version = v.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let got_kind = v.get("kind").and_then(Value::as_str).unwrap_or("");
    if got_version != api_version {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({got_version}) does not match the expected API version ({api_version})"
        )));
    }
    if got_kind != kind {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({got_kind}) does not match the expected kind ({kind})"
        )));
    }
    Ok(v)
}

/// The `/scale` subresource: an autoscaling/v1 `Scale` view of `spec.replicas`.
fn scale(
    shared: &Shared,
    method: &Method,
    t: &Target,
    content_type: &str,
    body: &Bytes,
    parse: impl Fn(&Bytes) -> Result<Value, ApiError>,
) -> Result<Value, ApiError> {
    let name = t.name.as_deref().ok_or_else(method_not_allowed)?;
    let ns = t.ns.as_deref();
    let current = shared.lock().get(t.res, ns, name)?.value();
    let want = match *method {
        Method::GET => return Ok(scale_of(&current)),
        Method::PUT => parse(body)?,
        Method::PATCH => {
            let ct = content_type.split(';').next().unwrap_or("").trim();
            if !matches!(
                ct,
                "application/merge-patch+json" | "application/strategic-merge-patch+json"
            ) {
                return Err(ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    format!("the body of the request was in an unknown format - accepted media types include: application/merge-patch+json, application/strategic-merge-patch+json (got {ct:?})"),
                ));
            }
            let mut s = scale_of(&current);
            if ct == "application/merge-patch+json" {
                merge_patch(&mut s, &parse_body(body)?);
            } else {
                strategic_merge_patch(&mut s, &parse_body(body)?);
            }
            s
        }
        _ => return Err(method_not_allowed()),
    };
    let replicas = want.at("/spec/replicas").and_then(Value::as_i64).unwrap_or(0);
    if replicas < 0 {
        return Err(ApiError::new(
            422,
            "Invalid",
            format!("Scale.autoscaling \"{name}\" is invalid: spec.replicas: Invalid value: {replicas}: must be greater than or equal to 0"),
        ));
    }
    let mut patch = json!({"spec": {"replicas": replicas}});
    if let Some(rv) = want.at("/metadata/resourceVersion").and_then(Value::as_str) {
        if !rv.is_empty() {
            patch["metadata"] = json!({"resourceVersion": rv});
        }
    }
    let obj = write(shared, |st| st.patch(t.res, ns, name, &patch, false))?;
    Ok(scale_of(&obj.value()))
}

/// The `Scale` of an object with `spec.replicas` and a label selector.
fn scale_of(obj: &Value) -> Value {
    let meta = obj.get("metadata").cloned().unwrap_or_else(|| json!({}));
    let mut m = serde_json::Map::new();
    for k in ["name", "namespace", "uid", "resourceVersion", "creationTimestamp"] {
        if let Some(v) = meta.get(k) {
            m.insert(k.into(), v.clone());
        }
    }
    let selector = obj
        .at("/spec/selector/matchLabels")
        .and_then(Value::as_object)
        .map(|l| {
            l.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    let replicas = obj.at("/spec/replicas").and_then(Value::as_i64).unwrap_or(1);
    let status_replicas = obj.at("/status/replicas").and_then(Value::as_i64).unwrap_or(0);
    json!({"kind": "Scale", "apiVersion": "autoscaling/v1", "metadata": m,
           "spec": {"replicas": replicas}, "status": {"replicas": status_replicas, "selector": selector}})
}

fn method_not_allowed() -> ApiError {
    ApiError::new(
        405,
        "MethodNotAllowed",
        "the server does not allow this method on the requested resource",
    )
}

fn parse_body(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("error decoding request body: {e}")))
}

/// Run a write under the lock and wake the watchers.
fn write<T>(shared: &Shared, f: impl FnOnce(&mut State) -> Result<T, ApiError>) -> Result<T, ApiError> {
    let mut st = shared.lock();
    let out = f(&mut st);
    let rv = st.rv;
    drop(st);
    shared.notify(rv);
    out
}

fn patch(
    shared: &Shared,
    t: &Target,
    name: &str,
    content_type: &str,
    body: &Bytes,
) -> Result<(StatusCode, Arc<Obj>), ApiError> {
    let ct = content_type.split(';').next().unwrap_or("").trim();
    // The media type first: a protobuf body is a 415, not a decoding error.
    let known = [
        "application/merge-patch+json",
        "application/strategic-merge-patch+json",
        "application/apply-patch+yaml",
        "application/json-patch+json",
    ];
    let p = if known.contains(&ct) {
        parse_body(body)?
    } else {
        Value::Null
    };
    match ct {
        "application/json-patch+json" => {
            let ops: json_patch::Patch = serde_json::from_value(p.clone())
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            let raw = p.as_array().cloned().unwrap_or_default();
            write(shared, |st| {
                let current = st.get(t.res, t.ns.as_deref(), name)?;
                let mut v = st.value_of(&current);
                for (op, raw) in ops.0.iter().zip(&raw) {
                    // The real server's JSON patch lets `test` of null pass on an absent
                    // field (kube's finalizer helper relies on it); json-patch does not.
                    let path = raw.get("path").and_then(Value::as_str).unwrap_or_default();
                    if raw.get("op").and_then(Value::as_str) == Some("test")
                        && raw.get("value").is_some_and(Value::is_null)
                        && v.at(path).is_none()
                    {
                        continue;
                    }
                    json_patch::patch(&mut v, std::slice::from_ref(op)).map_err(|e| {
                        ApiError::new(
                            422,
                            "Invalid",
                            format!("the server rejected our request due to an error in our request: {e}"),
                        )
                    })?;
                }
                st.update(t.res, t.ns.as_deref(), name, v, t.status)
            })
            .map(|o| (StatusCode::OK, o))
        }
        "application/merge-patch+json" => {
            write(shared, |st| st.patch(t.res, t.ns.as_deref(), name, &p, t.status)).map(|o| (StatusCode::OK, o))
        }
        "application/strategic-merge-patch+json" => write(shared, |st| {
            st.patch_with(t.res, t.ns.as_deref(), name, &p, t.status, strategic_merge_patch)
        })
        .map(|o| (StatusCode::OK, o)),
        // Server-side apply, approximated: create if absent, otherwise merge.
        "application/apply-patch+yaml" => write(shared, |st| match st.get(t.res, t.ns.as_deref(), name) {
            Ok(_) => st.patch(t.res, t.ns.as_deref(), name, &p, t.status),
            Err(_) => {
                let mut v = p.clone();
                if let Some(m) = v.as_object_mut() {
                    let meta = m.entry("metadata").or_insert_with(|| json!({}));
                    if let Some(meta) = meta.as_object_mut() {
                        meta.insert("name".into(), json!(name));
                    }
                }
                st.create(t.res, t.ns.as_deref(), v)
            }
        })
        .map(|o| (StatusCode::OK, o)),
        _ => Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml (got {ct:?})"),
        )),
    }
}
