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

use std::convert::Infallible;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;

use super::store::{ApiError, Obj, State};
use super::util::parse_query;
use super::{ResourceDef, Shared};
use discovery::{
    api_group, api_groups, api_versions, has_group_version, openapi_gv, openapi_root, resource_list, version_body,
};
use list::list;
pub(crate) use list::{decode_continue, encode_continue};
use response::{failure_response, full_response, json_response, not_found_path, status_response, text_response};
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
    if let Some(agent) = req.headers().get(header::USER_AGENT).and_then(|v| v.to_str().ok()) {
        let mut seen = shared
            .user_agents
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
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
