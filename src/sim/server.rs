//! The HTTP side of the simulated server: routing, discovery, LIST, WATCH, GET and writes.
//!
//! Read top to bottom: `serve` accepts connections, `handle` routes a request, then one
//! function per verb. Storage lives in `store`; this file never mutates objects itself.

use std::convert::Infallible;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::faults::Failure;
use super::store::{ApiError, EventKind, Obj, State};
use super::util::{b64_decode, b64_encode, parse_query};
use super::{ResourceDef, Shared};
use crate::selector::{FieldSelector, LabelSelector};

type Body = UnsyncBoxBody<Bytes, io::Error>;
type Resp = Response<Body>;

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
struct Query(Vec<(String, String)>);

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
struct Target {
    res: usize,
    def: Arc<ResourceDef>,
    ns: Option<String>,
    name: Option<String>,
    status: bool,
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Resp {
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
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = Query(parse_query(req.uri().query()));
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let accept_protobuf = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("protobuf"));
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
                    resource_request(&shared, method, t, &query, &content_type, &body).await
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
        let status = match sub {
            None => false,
            Some(&"status") => true,
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
    if t.status && !matches!(method, Method::GET | Method::PUT | Method::PATCH) {
        return status_response(shared, &method_not_allowed());
    }
    let ct = content_type.split(';').next().unwrap_or("").trim();
    if !body.is_empty()
        && (ct.contains("protobuf")
            || ct.contains("cbor")
            || ct.contains("yaml") && ct != "application/apply-patch+yaml")
    {
        return status_response(
            shared,
            &ApiError::new(415, "UnsupportedMediaType", format!("the body of the request was in an unknown format - accepted media types include: application/json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml (got {ct})")),
        );
    }
    let result = match (&method, &t.name) {
        (&Method::GET, None) if is_watch => return watch(shared, &t, q).await,
        (&Method::GET, None) => return list(shared, &t, q).await,
        (&Method::GET, Some(name)) => shared
            .lock()
            .get(t.res, t.ns.as_deref(), name)
            .map(|o| (StatusCode::OK, o)),
        (&Method::POST, None) => parse_body(body)
            .and_then(|v| write(shared, |st| st.create(t.res, t.ns.as_deref(), v)).map(|o| (StatusCode::CREATED, o))),
        (&Method::PUT, Some(name)) => parse_body(body).and_then(|v| {
            write(shared, |st| st.update(t.res, t.ns.as_deref(), name, v, t.status)).map(|o| (StatusCode::OK, o))
        }),
        (&Method::PATCH, Some(name)) => patch(shared, &t, name, content_type, body),
        (&Method::DELETE, Some(name)) => {
            write(shared, |st| st.delete(t.res, t.ns.as_deref(), name)).map(|o| (StatusCode::OK, o))
        }
        _ => Err(method_not_allowed()),
    };
    match result {
        Ok((code, obj)) => full_response(code, obj.full.clone()),
        Err(e) => status_response(shared, &e),
    }
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
fn write(shared: &Shared, f: impl FnOnce(&mut State) -> Result<Arc<Obj>, ApiError>) -> Result<Arc<Obj>, ApiError> {
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
    let p = parse_body(body)?;
    match ct {
        // Strategic merge patch behaves like a merge patch for maps and scalars, which is what
        // `kubectl label/annotate` and status updates send; list merging by key is not emulated.
        "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
            write(shared, |st| st.patch(t.res, t.ns.as_deref(), name, &p, t.status)).map(|o| (StatusCode::OK, o))
        }
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
            format!("the body of the request was in an unknown format - accepted media types include: application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml (got {ct:?})"),
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// LIST

struct Selectors {
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Selectors {
    fn parse(def: &ResourceDef, q: &Query) -> Result<Self, ApiError> {
        let labels = LabelSelector::parse(q.str("labelSelector")).map_err(|e| ApiError::bad_request(e.to_string()))?;
        let fields = FieldSelector::parse(q.str("fieldSelector")).map_err(|e| ApiError::bad_request(e.to_string()))?;
        for r in fields.requirements() {
            let f = r.field();
            if f != "metadata.name" && f != "metadata.namespace" && !def.extra_fields().contains(&f) {
                return Err(ApiError::bad_request(format!("field label not supported: {f}")));
            }
        }
        Ok(Self { labels, fields })
    }
    fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }
    fn matches(&self, o: &Obj) -> bool {
        o.matches(&self.labels, &self.fields)
    }
}

fn parse_rv(s: &str) -> Result<u64, ApiError> {
    s.parse::<u64>().map_err(|_| {
        ApiError::bad_request(format!(
            "resourceVersion: Invalid value: {s:?}: must be a non-negative integer"
        ))
    })
}

fn invalid_list_options(causes: &[(&str, &str)]) -> ApiError {
    let msgs: Vec<String> = causes.iter().map(|(f, m)| format!("{f}: {m}")).collect();
    let mut e = ApiError::new(
        422,
        "Invalid",
        format!("ListOptions.meta.k8s.io \"\" is invalid: [{}]", msgs.join(", ")),
    );
    let causes: Vec<Value> = causes
        .iter()
        .map(|(f, m)| json!({"reason": "FieldValueForbidden", "message": m, "field": f}))
        .collect();
    e.details = Some(json!({"group": "meta.k8s.io", "kind": "ListOptions", "causes": causes}));
    e
}

/// Wait until the server reaches `rv`; false after `wait`.
async fn wait_for_rv(shared: &Shared, rv: u64, wait: Duration) -> bool {
    let mut rx = shared.rv_tx.subscribe();
    let reached = matches!(tokio::time::timeout(wait, rx.wait_for(|&v| v >= rv)).await, Ok(Ok(_)));
    reached
}

fn too_large(requested: u64, current: u64) -> ApiError {
    let mut e = ApiError::new(
        504,
        "Timeout",
        format!("Timeout: Too large resource version: {requested}, current: {current}"),
    );
    e.details = Some(json!({
        "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
        "retryAfterSeconds": 1
    }));
    e
}

#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct ContinueToken {
    v: String,
    pub(crate) rv: i64,
    pub(crate) start: String,
}

pub(crate) fn encode_continue(rv: i64, start: &str) -> String {
    let t = ContinueToken {
        v: "meta.k8s.io/v1".into(),
        rv,
        start: start.into(),
    };
    b64_encode(&serde_json::to_vec(&t).unwrap_or_default())
}

pub(crate) fn decode_continue(s: &str) -> Result<ContinueToken, ApiError> {
    let bad = |why: &str| ApiError::bad_request(format!("continue key is not valid: {why}"));
    let raw = b64_decode(s).ok_or_else(|| bad("illegal base64 data"))?;
    let t: ContinueToken = serde_json::from_slice(&raw).map_err(|e| bad(&e.to_string()))?;
    if t.v != "meta.k8s.io/v1" {
        return Err(bad("incorrect encoded start resourceVersion (version meta.k8s.io/v1)"));
    }
    if t.start.is_empty() || t.start.starts_with('/') || t.start.split('/').any(|p| p == "..") {
        return Err(bad("path traversal attempt detected"));
    }
    if t.rv < -1 || t.rv == 0 {
        return Err(bad("incorrect encoded start resourceVersion"));
    }
    Ok(t)
}

async fn list(shared: &Arc<Shared>, t: &Target, q: &Query) -> Resp {
    match list_inner(shared, t, q).await {
        Ok(r) => r,
        Err(e) => status_response(shared, &e),
    }
}

async fn list_inner(shared: &Arc<Shared>, t: &Target, q: &Query) -> Result<Resp, ApiError> {
    let sel = Selectors::parse(&t.def, q)?;
    let limit = match q.get("limit").filter(|s| !s.is_empty()) {
        None => None,
        Some(s) => match s.parse::<i64>() {
            Ok(n) if n > 0 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
            Ok(_) => None,
            Err(_) => {
                return Err(ApiError::bad_request(format!(
                    "limit: Invalid value: {s:?}: must be an integer"
                )))
            }
        },
    };
    let rv = q.str("resourceVersion");
    let rvm = q.str("resourceVersionMatch");
    let cont = q.str("continue");
    if !rvm.is_empty() {
        if rvm != "Exact" && rvm != "NotOlderThan" {
            return Err(invalid_list_options(&[(
                "resourceVersionMatch",
                "Unsupported value: supported values: \"Exact\", \"NotOlderThan\"",
            )]));
        }
        if rv.is_empty() {
            return Err(invalid_list_options(&[(
                "resourceVersionMatch",
                "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
            )]));
        }
        if rvm == "Exact" && rv == "0" {
            return Err(invalid_list_options(&[(
                "resourceVersionMatch",
                "Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
            )]));
        }
    }
    if !cont.is_empty() && !rv.is_empty() && rv != "0" {
        return Err(ApiError::bad_request(
            "specifying resource version is not allowed when using continue",
        ));
    }
    let prefix = match (&t.ns, t.def.namespaced) {
        (Some(ns), true) => format!("{ns}/"),
        _ => String::new(),
    };
    // (at: None = current revision, whether to paginate, start key relative to prefix)
    let mut at: Option<u64> = None;
    let mut paginate = limit.is_some();
    let mut start = String::new();
    let mut token_rv: Option<i64> = None;
    if !cont.is_empty() {
        let tok = decode_continue(cont)?;
        start = tok.start;
        token_rv = Some(tok.rv);
        if tok.rv > 0 {
            at = Some(u64::try_from(tok.rv).unwrap_or(0));
        }
    } else if rv == "0" {
        paginate = false;
    } else if !rv.is_empty() {
        let n = parse_rv(rv)?;
        if !wait_for_rv(shared, n, shared.config.too_large_rv_wait).await {
            let cur = shared.lock().rv;
            if n > cur {
                return Err(too_large(n, cur));
            }
        }
        let exact = rvm == "Exact" || (rvm.is_empty() && limit.is_some());
        if exact {
            at = Some(n);
        }
    }

    let mut st = shared.lock();
    st.maintain();
    if let Some(a) = at {
        if a < st.compact_rv || a > st.rv {
            if token_rv.is_some() {
                let mut e = ApiError::new(410, "Expired", "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.");
                e.details = None;
                drop(st);
                let meta = json!({"continue": encode_continue(-1, &start)});
                return Ok(status_response_meta(shared, &e, meta));
            }
            return Err(ApiError::new(
                410,
                "Expired",
                "The resourceVersion for the provided list is too old.",
            ));
        }
    }
    let list_rv = at.unwrap_or(st.rv);
    let from = format!("{prefix}{start}");
    let mut items: Vec<Arc<Obj>> = Vec::new();
    let mut cont_out = None;
    let mut remaining = None;
    let mut memo_next = None;
    {
        let mut it = st.snapshot_iter(t.res, list_rv, &prefix, &from);
        let max = if paginate {
            limit.unwrap_or(usize::MAX)
        } else {
            usize::MAX
        };
        for o in it.by_ref() {
            if sel.matches(&o) {
                items.push(o);
                if items.len() >= max {
                    break;
                }
            }
        }
        if paginate && items.len() >= max {
            if sel.is_empty() {
                let memo = (t.res, list_rv, prefix.clone(), from.clone());
                let n = match st.remaining_at(&memo) {
                    Some(from_here) => from_here.saturating_sub(items.len()),
                    None => it.count(),
                };
                if let Some(last) = items.last() {
                    memo_next = Some(((t.res, list_rv, prefix.clone(), format!("{}\u{0}", last.key)), n));
                }
                if n > 0 {
                    remaining = Some(n);
                }
            } else if it.next().is_some() {
                remaining = Some(0);
            }
            if remaining.is_some() {
                if let Some(last) = items.last() {
                    let rel = last.key.strip_prefix(prefix.as_str()).unwrap_or(&last.key);
                    let tok_rv = if token_rv == Some(-1) {
                        -1
                    } else {
                        i64::try_from(list_rv).unwrap_or(-1)
                    };
                    cont_out = Some(encode_continue(tok_rv, &format!("{rel}\u{0}")));
                }
            }
        }
    }
    if let Some((key, n)) = memo_next {
        st.remember_remaining(key, n);
    }
    drop(st);
    shared
        .counters
        .list_objects
        .fetch_add(items.len() as u64, Ordering::Relaxed);

    let mut out = Vec::with_capacity(items.iter().map(|o| o.full.len()).sum::<usize>() + 256);
    out.extend_from_slice(
        format!(
            r#"{{"kind":{},"apiVersion":{},"metadata":{{"resourceVersion":"{list_rv}""#,
            json!(format!("{}List", t.def.kind)),
            json!(t.def.api_version())
        )
        .as_bytes(),
    );
    if let Some(c) = &cont_out {
        out.extend_from_slice(format!(r#","continue":"{c}""#).as_bytes());
        if let Some(n) = remaining.filter(|_| sel.is_empty()) {
            out.extend_from_slice(format!(r#","remainingItemCount":{n}"#).as_bytes());
        }
    }
    out.extend_from_slice(br#"},"items":["#);
    for (i, o) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        o.write_item(&mut out);
    }
    out.extend_from_slice(b"]}\n");
    Ok(full_response(StatusCode::OK, Bytes::from(out)))
}

// ---------------------------------------------------------------------------------------------
// WATCH

enum Start {
    /// Synthetic ADDED events for the current state first (`end_bookmark`: streaming list).
    Initial { end_bookmark: bool },
    /// Events after this revision.
    From(u64),
}

struct WatchPlan {
    res: usize,
    def: Arc<ResourceDef>,
    ns: Option<String>,
    sel: Selectors,
    start: Start,
    /// The streaming list's initial state must be at least this revision.
    min_rv: u64,
    timeout: Duration,
    bookmarks: bool,
    drop_after: Option<u64>,
    stall: bool,
    cut: bool,
    garble: Option<u64>,
}

async fn watch(shared: &Arc<Shared>, t: &Target, q: &Query) -> Resp {
    // Subscribed before the plan reads any state: a restore that lands while the request
    // waits or while its task starts must still end the stream.
    let mut epoch = shared.epoch_tx.subscribe();
    epoch.mark_unchanged();
    match plan_watch(shared, t, q) {
        Ok(plan) => {
            // Like the cacher's waitUntilFreshAndBlock: a streaming list for a revision the
            // server has not reached waits for it, then fails before the stream starts. The
            // `too_large_watches` fault does the same for plain watches from a future revision.
            let need = match plan.start {
                Start::From(n) if shared.faults.lock().too_large_watches => n,
                _ => plan.min_rv,
            };
            if need > 0 {
                wait_for_rv(shared, need, shared.config.too_large_rv_wait).await;
                // The state, not the notification, decides: a restore may have moved the
                // revision back after the wait saw it reached.
                let cur = shared.lock().rv;
                if need > cur {
                    return status_response(shared, &too_large(need, cur));
                }
            }
            let (tx, rx) = mpsc::channel::<Result<Bytes, io::Error>>(16);
            tokio::spawn(run_watch(shared.clone(), plan, epoch, tx));
            let stream = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) })
                .map(|c| c.map(Frame::data));
            let mut resp = Response::new(StreamBody::new(stream).boxed_unsync());
            resp.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            resp.headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache, private"));
            resp
        }
        Err(e) => status_response(shared, &e),
    }
}

fn plan_watch(shared: &Shared, t: &Target, q: &Query) -> Result<WatchPlan, ApiError> {
    let cfg = &shared.config;
    let sel = Selectors::parse(&t.def, q)?;
    let rv = q.str("resourceVersion");
    let rvm = q.str("resourceVersionMatch");
    let send_initial = q.get("sendInitialEvents");
    let allow_bookmarks = q.flag("allowWatchBookmarks");
    let timeout = match q.get("timeoutSeconds").filter(|s| !s.is_empty()) {
        None => cfg.default_watch_timeout,
        Some(s) => Duration::from_secs(s.parse::<u64>().map_err(|_| {
            ApiError::bad_request(format!(
                "timeoutSeconds: Invalid value: {s:?}: must be a non-negative integer"
            ))
        })?),
    };
    // A streaming list answers "not older than" this revision.
    let mut min_rv = 0;
    let start = if cfg.old_server {
        if !rvm.is_empty() {
            let mut causes = vec![(
                "resourceVersionMatch",
                "Forbidden: resourceVersionMatch is forbidden for watch",
            )];
            if rv.is_empty() {
                causes.push((
                    "resourceVersionMatch",
                    "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
                ));
            }
            return Err(invalid_list_options(&causes));
        }
        // sendInitialEvents is unknown to an old server and ignored.
        if rv.is_empty() || rv == "0" {
            Start::Initial { end_bookmark: false }
        } else {
            Start::From(parse_rv(rv)?)
        }
    } else if let Some(flag @ ("true" | "false")) = send_initial {
        if rvm != "NotOlderThan" {
            return Err(invalid_list_options(&[(
                "resourceVersionMatch",
                "Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            )]));
        }
        if !allow_bookmarks {
            return Err(invalid_list_options(&[(
                "allowWatchBookmarks",
                "Forbidden: sendInitialEvents requires allowWatchBookmarks=true",
            )]));
        }
        let n = if rv.is_empty() { 0 } else { parse_rv(rv)? };
        if flag == "true" {
            min_rv = n;
            Start::Initial { end_bookmark: true }
        } else if n == 0 {
            // sendInitialEvents=false with rv ""/"0": a plain watch from the latest revision
            Start::From(shared.lock().rv)
        } else {
            Start::From(n)
        }
    } else {
        if !rvm.is_empty() {
            return Err(invalid_list_options(&[(
                "resourceVersionMatch",
                "Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
            )]));
        }
        if rv.is_empty() || rv == "0" {
            Start::Initial { end_bookmark: false }
        } else {
            Start::From(parse_rv(rv)?)
        }
    };
    let faults = &shared.faults;
    let drop_after = faults.lock().drop_watch_after;
    let stall = faults.take_counter(|f| &mut f.stall_watches);
    let cut = faults.take_counter(|f| &mut f.cut_watches);
    let garble = faults.lock().garble_watch.take();
    Ok(WatchPlan {
        res: t.res,
        def: t.def.clone(),
        ns: t.ns.clone().filter(|_| t.def.namespaced),
        sel,
        start,
        min_rv,
        timeout,
        bookmarks: allow_bookmarks && cfg.watch_cache,
        drop_after,
        stall,
        cut,
        garble,
    })
}

/// The `BOOKMARK` event for a resource: only the resourceVersion is meaningful; the rest is the
/// empty object's shape as a real server serializes it.
fn bookmark_line(def: &ResourceDef, rv: u64, initial_end: bool) -> Vec<u8> {
    let annotations = if initial_end {
        r#","annotations":{"k8s.io/initial-events-end":"true"}"#
    } else {
        ""
    };
    let tail = if def.group.is_empty() && def.plural == "pods" {
        r#","spec":{"containers":null},"status":{}"#
    } else if def.group == "apps" && def.plural == "deployments" {
        r#","spec":{"selector":null,"template":{"metadata":{"creationTimestamp":null},"spec":{"containers":null}},"strategy":{}},"status":{}"#
    } else if def.group.is_empty() && def.plural == "namespaces" {
        r#","spec":{},"status":{}"#
    } else if def.group.is_empty() && def.plural == "nodes" {
        // NodeStatus's daemonEndpoints and nodeInfo are structs: Go's omitempty keeps them.
        concat!(
            r#","spec":{},"status":{"daemonEndpoints":{"kubeletEndpoint":{"Port":0}},"#,
            r#""nodeInfo":{"machineID":"","systemUUID":"","bootID":"","kernelVersion":"","osImage":"","#,
            r#""containerRuntimeVersion":"","kubeletVersion":"","kubeProxyVersion":"","operatingSystem":"","#,
            r#""architecture":""}}"#
        )
    } else {
        ""
    };
    format!(
        "{{\"type\":\"BOOKMARK\",\"object\":{{\"kind\":{},\"apiVersion\":{},\"metadata\":{{\"resourceVersion\":\"{rv}\",\"creationTimestamp\":null{annotations}}}{tail}}}}}\n",
        json!(def.kind),
        json!(def.api_version())
    )
    .into_bytes()
}

fn event_line(out: &mut Vec<u8>, kind: &str, obj: &Obj) {
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    out.extend_from_slice(&obj.full);
    out.extend_from_slice(b"}\n");
}

fn expired_line(watch_cache: bool, rv: u64, compact_rv: u64) -> Vec<u8> {
    let message = if watch_cache {
        format!("too old resource version: {rv} ({compact_rv})")
    } else {
        "The resourceVersion for the provided watch is too old.".to_string()
    };
    let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": "Expired", "code": 410});
    let mut out = format!("{{\"type\":\"ERROR\",\"object\":{status}}}").into_bytes();
    out.push(b'\n');
    out
}

/// How a stored event looks to a watcher with selectors (None: not visible).
fn visible(sel: &Selectors, kind: EventKind, obj: &Obj, prev: Option<&Obj>) -> Option<&'static str> {
    if sel.is_empty() {
        return Some(kind.as_str());
    }
    match kind {
        EventKind::Added => sel.matches(obj).then_some("ADDED"),
        EventKind::Deleted => sel.matches(prev.unwrap_or(obj)).then_some("DELETED"),
        EventKind::Modified => match (prev.is_some_and(|p| sel.matches(p)), sel.matches(obj)) {
            (true, true) => Some("MODIFIED"),
            (false, true) => Some("ADDED"),
            (true, false) => Some("DELETED"),
            (false, false) => None,
        },
    }
}

const CHUNK: usize = 256 * 1024;
const BATCH_EVENTS: usize = 4096;

/// Writes into the response channel, counting and applying the per-watch faults.
struct Sink {
    shared: Arc<Shared>,
    tx: mpsc::Sender<Result<Bytes, io::Error>>,
    buf: Vec<u8>,
    events: u64,
    drop_after: Option<u64>,
    cut: bool,
    garble: Option<u64>,
}

impl Sink {
    /// Queue one event line; false when the stream must end.
    async fn event(&mut self, line_start: usize) -> bool {
        self.events += 1;
        self.shared.counters.watch_events.fetch_add(1, Ordering::Relaxed);
        if self.garble.is_some_and(|k| self.events == k + 1) {
            // The line cut short but newline-terminated: a malformed line, not a cut stream.
            self.garble = None;
            let half = line_start + (self.buf.len() - line_start) / 2;
            self.buf.truncate(half);
            self.buf.push(b'\n');
        }
        if self.cut {
            let half = line_start + (self.buf.len() - line_start) / 2;
            self.buf.truncate(half);
            let _ = self.flush().await;
            // let the half line reach the socket before the connection is aborted
            tokio::time::sleep(Duration::from_millis(50)).await;
            let _ = self
                .tx
                .send(Err(io::Error::other("sim fault: chunk cut in half")))
                .await;
            return false;
        }
        if self.drop_after.is_some_and(|k| self.events >= k) {
            let _ = self.flush().await;
            return false;
        }
        if self.buf.len() >= CHUNK {
            return self.flush().await;
        }
        true
    }

    async fn flush(&mut self) -> bool {
        if self.buf.is_empty() {
            return true;
        }
        let next = Vec::with_capacity(CHUNK + 16 * 1024);
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, next));
        self.shared
            .counters
            .bytes_served
            .fetch_add(chunk.len() as u64, Ordering::Relaxed);
        self.tx.send(Ok(chunk)).await.is_ok()
    }
}

async fn run_watch(
    shared: Arc<Shared>,
    plan: WatchPlan,
    mut epoch_rx: tokio::sync::watch::Receiver<u64>,
    tx: mpsc::Sender<Result<Bytes, io::Error>>,
) {
    let deadline = Instant::now() + plan.timeout;
    if plan.stall {
        tokio::select! {
            () = tx.closed() => {}
            () = tokio::time::sleep_until(deadline + Duration::from_secs(3600)) => {}
        }
        return;
    }
    let mut rv_rx = shared.rv_tx.subscribe();
    let watch_cache = shared.config.watch_cache;
    let mut sink = Sink {
        shared: shared.clone(),
        tx: tx.clone(),
        buf: Vec::with_capacity(CHUNK + 8192),
        events: 0,
        drop_after: plan.drop_after,
        cut: plan.cut,
        garble: plan.garble,
    };
    let prefix = plan.ns.as_ref().map(|ns| format!("{ns}/")).unwrap_or_default();

    // Position: every event with rv <= pos has been considered.
    let mut pos = match plan.start {
        Start::From(n) => n,
        Start::Initial { end_bookmark } => {
            let (objs, rv) = {
                let mut st = shared.lock();
                st.maintain();
                let rv = st.rv;
                let objs: Vec<Arc<Obj>> = st.snapshot_iter(plan.res, rv, &prefix, "").collect();
                (objs, rv)
            };
            if rv < plan.min_rv {
                // a backup restored since the wait moved the revision back: never answer
                // "not older than N" with an older state
                return;
            }
            for o in objs.iter().filter(|o| plan.sel.matches(o)) {
                let at = sink.buf.len();
                event_line(&mut sink.buf, "ADDED", o);
                if !sink.event(at).await {
                    return;
                }
            }
            if end_bookmark {
                sink.buf.extend_from_slice(&bookmark_line(&plan.def, rv, true));
                shared.counters.bookmarks.fetch_add(1, Ordering::Relaxed);
            }
            if !sink.flush().await {
                return;
            }
            rv
        }
    };

    let interval = shared.config.bookmark_interval.max(Duration::from_millis(10));
    let mut next_bookmark = Instant::now() + interval;
    // A cacher schedules no bookmark after deadline - bookmark_before_timeout, and none at all
    // when that moment has already passed (timeoutSeconds shorter than the pre-timeout).
    let last_bookmark = deadline.checked_sub(shared.config.bookmark_before_timeout);
    let mut final_bookmark = last_bookmark.filter(|t| plan.bookmarks && *t > Instant::now());
    let mut caught_up = false;
    loop {
        // Drain the history after `pos`.
        let drained = {
            let mut st = shared.lock();
            st.maintain();
            if pos < st.compact_rv {
                Err(expired_line(watch_cache, pos, st.compact_rv))
            } else {
                let i = st.history.partition_point(|e| e.rv <= pos);
                let end = (i + BATCH_EVENTS).min(st.history.len());
                let mut batch = Vec::new();
                for e in st.history.range(i..end) {
                    if e.res == plan.res && e.obj.key.starts_with(&prefix) {
                        batch.push((e.kind, e.obj.clone(), e.prev.clone()));
                    }
                }
                if end > i {
                    pos = st.history[end - 1].rv;
                }
                let more = end < st.history.len();
                if !more && pos < st.rv {
                    pos = st.rv;
                }
                caught_up = pos <= st.rv;
                Ok((batch, more))
            }
        };
        let (batch, more) = match drained {
            Ok(x) => x,
            Err(line) => {
                sink.buf.extend_from_slice(&line);
                shared.counters.watch_events.fetch_add(1, Ordering::Relaxed);
                let _ = sink.flush().await;
                return;
            }
        };
        for (kind, obj, prev) in &batch {
            if let Some(t) = visible(&plan.sel, *kind, obj, prev.as_deref()) {
                let at = sink.buf.len();
                event_line(&mut sink.buf, t, obj);
                if !sink.event(at).await {
                    return;
                }
            }
        }
        if !sink.flush().await {
            return;
        }
        if more {
            continue;
        }
        let bookmark_due = final_bookmark.map(|f| f.min(next_bookmark));
        tokio::select! {
            biased;
            () = tx.closed() => return,
            () = tokio::time::sleep_until(deadline) => return,
            r = epoch_rx.changed() => { let _ = r; return; }
            r = rv_rx.changed() => if r.is_err() { return },
            () = async { if let Some(d) = bookmark_due { tokio::time::sleep_until(d).await } else { futures::future::pending::<()>().await } } => {
                let now = Instant::now();
                if final_bookmark.is_some_and(|f| f <= now) {
                    final_bookmark = None;
                }
                next_bookmark = now + interval;
                if caught_up {
                    sink.buf.extend_from_slice(&bookmark_line(&plan.def, pos, false));
                    shared.counters.bookmarks.fetch_add(1, Ordering::Relaxed);
                    if !sink.flush().await {
                        return;
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Responses and discovery

fn full_response(code: StatusCode, body: Bytes) -> Resp {
    let mut resp = Response::new(
        Full::new(body)
            .map_err(|never: Infallible| match never {})
            .boxed_unsync(),
    );
    *resp.status_mut() = code;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache, private"));
    resp
}

fn json_response(code: StatusCode, v: Value) -> Resp {
    full_response(code, Bytes::from(serde_json::to_vec(&v).unwrap_or_default()))
}

fn text_response(s: &'static str) -> Resp {
    let mut r = full_response(StatusCode::OK, Bytes::from_static(s.as_bytes()));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn status_value(e: &ApiError, metadata: Value) -> Value {
    let mut v = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": metadata, "status": "Failure",
        "message": e.message, "reason": e.reason, "code": e.code
    });
    if let (Some(d), Some(o)) = (&e.details, v.as_object_mut()) {
        o.insert("details".into(), d.clone());
    }
    v
}

fn status_response_meta(_shared: &Shared, e: &ApiError, metadata: Value) -> Resp {
    let code = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = json_response(code, status_value(e, metadata));
    if let Some(secs) = e
        .details
        .as_ref()
        .and_then(|d| d.get("retryAfterSeconds"))
        .and_then(Value::as_u64)
    {
        if let Ok(h) = HeaderValue::from_str(&secs.to_string()) {
            r.headers_mut().insert(header::RETRY_AFTER, h);
        }
    }
    r
}

fn status_response(shared: &Shared, e: &ApiError) -> Resp {
    status_response_meta(shared, e, json!({}))
}

fn not_found_path() -> Resp {
    let e = ApiError::new(404, "NotFound", "the server could not find the requested resource");
    json_response(StatusCode::NOT_FOUND, status_value(&e, json!({})))
}

fn failure_response(shared: &Shared, f: Failure) -> Resp {
    match f {
        Failure::TooManyRequests { retry_after_secs } => {
            let mut e = ApiError::new(429, "TooManyRequests", "Too many requests, please try again later.");
            e.details = Some(json!({"retryAfterSeconds": retry_after_secs}));
            status_response(shared, &e)
        }
        Failure::InternalError => status_response(
            shared,
            &ApiError::new(
                500,
                "InternalError",
                "Internal error occurred: injected by the simulated API server",
            ),
        ),
    }
}

fn version_body(shared: &Shared) -> Value {
    let (minor, git) = if shared.config.old_server {
        ("20", "v1.20.2")
    } else {
        ("33", "v1.33.0")
    };
    json!({"major": "1", "minor": minor, "gitVersion": git, "gitCommit": "durable-informer-sim",
           "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24",
           "compiler": "gc", "platform": "linux/amd64"})
}

fn api_versions() -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"],
           "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]})
}

fn groups(st: &State) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for d in st.resources.iter().filter(|d| !d.group.is_empty()) {
        match out.iter_mut().find(|(g, _)| *g == d.group) {
            Some((_, vs)) => {
                if !vs.contains(&d.version) {
                    vs.push(d.version.clone());
                }
            }
            None => out.push((d.group.clone(), vec![d.version.clone()])),
        }
    }
    out
}

fn group_value(g: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
        .collect();
    json!({"name": g, "versions": vs, "preferredVersion": vs.first().cloned().unwrap_or(Value::Null)})
}

fn api_groups(st: &State) -> Value {
    let gs: Vec<Value> = groups(st).iter().map(|(g, vs)| group_value(g, vs)).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": gs})
}

fn api_group(st: &State, g: &str) -> Option<Value> {
    groups(st).iter().find(|(name, _)| name == g).map(|(name, vs)| {
        let mut v = group_value(name, vs);
        if let Some(o) = v.as_object_mut() {
            o.insert("kind".into(), json!("APIGroup"));
            o.insert("apiVersion".into(), json!("v1"));
        }
        v
    })
}

fn has_group_version(st: &State, g: &str, v: &str) -> bool {
    st.resources.iter().any(|d| d.group == g && d.version == v)
}

fn resource_list(st: &State, g: &str, v: &str) -> Value {
    let mut resources = Vec::new();
    for d in st.resources.iter().filter(|d| d.group == g && d.version == v) {
        let mut r = json!({
            "name": d.plural, "singularName": d.kind.to_lowercase(), "namespaced": d.namespaced,
            "kind": d.kind,
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
        });
        if !d.short_names.is_empty() {
            if let Some(o) = r.as_object_mut() {
                o.insert("shortNames".into(), json!(d.short_names));
            }
        }
        resources.push(r);
        if d.status_subresource {
            resources.push(json!({"name": format!("{}/status", d.plural), "singularName": "",
                "namespaced": d.namespaced, "kind": d.kind, "verbs": ["get", "patch", "update"]}));
        }
    }
    let gv = if g.is_empty() {
        v.to_string()
    } else {
        format!("{g}/{v}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})
}

/// Minimal OpenAPI v3 discovery: enough for `kubectl` to see that the server validates fields
/// itself (`fieldValidation` on PATCH), so it skips client-side schema validation. No schemas.
fn openapi_root(st: &State) -> Value {
    let mut paths = serde_json::Map::new();
    paths.insert(
        "api/v1".into(),
        json!({"serverRelativeURL": "/openapi/v3/api/v1?hash=sim"}),
    );
    for (g, vs) in groups(st) {
        for v in vs {
            paths.insert(
                format!("apis/{g}/{v}"),
                json!({"serverRelativeURL": format!("/openapi/v3/apis/{g}/{v}?hash=sim")}),
            );
        }
    }
    json!({"paths": paths})
}

fn openapi_gv(st: &State, g: &str, v: &str) -> Value {
    let mut paths = serde_json::Map::new();
    let params = json!([
        {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
        {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
        {"name": "dryRun", "in": "query", "schema": {"type": "string"}}
    ]);
    for d in st.resources.iter().filter(|d| d.group == g && d.version == v) {
        let base = if g.is_empty() {
            format!("/api/{v}")
        } else {
            format!("/apis/{g}/{v}")
        };
        let path = if d.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}/{{name}}", d.plural)
        } else {
            format!("{base}/{}/{{name}}", d.plural)
        };
        let gvk = json!({"group": d.group, "version": d.version, "kind": d.kind});
        paths.insert(
            path,
            json!({
                "patch": {"x-kubernetes-group-version-kind": gvk, "parameters": params, "responses": {}},
                "put": {"x-kubernetes-group-version-kind": gvk, "parameters": params, "responses": {}}
            }),
        );
    }
    json!({"openapi": "3.0.0", "info": {"title": "Kubernetes (durable-informer sim)", "version": "v1.33.0"}, "paths": paths})
}
