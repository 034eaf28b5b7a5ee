//! Responses: bodies, `Status` objects and injected failures.

use std::convert::Infallible;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};

use super::super::faults::Failure;
use super::super::store::ApiError;
use super::super::Shared;
use super::Resp;

pub(super) fn full_response(code: StatusCode, body: Bytes) -> Resp {
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

pub(super) fn protobuf_response(code: StatusCode, body: Bytes) -> Resp {
    let mut r = full_response(code, body);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(super::super::pb::MEDIA_TYPE),
    );
    r
}

/// 406: the client accepts only formats the server cannot give for this kind.
pub(super) fn not_acceptable() -> Resp {
    let e = ApiError::new(
        406,
        "NotAcceptable",
        "only the following media types are accepted: application/json, application/yaml",
    );
    json_response(StatusCode::NOT_ACCEPTABLE, status_value(&e, json!({})))
}

pub(super) fn json_response(code: StatusCode, v: Value) -> Resp {
    full_response(code, Bytes::from(serde_json::to_vec(&v).unwrap_or_default()))
}

pub(super) fn text_response(s: &'static str) -> Resp {
    let mut r = full_response(StatusCode::OK, Bytes::from_static(s.as_bytes()));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

pub(super) fn status_value(e: &ApiError, metadata: Value) -> Value {
    let mut v = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": metadata, "status": "Failure",
        "message": e.message, "reason": e.reason, "code": e.code
    });
    if let (Some(d), Some(o)) = (&e.details, v.as_object_mut()) {
        o.insert("details".into(), d.clone());
    }
    v
}

pub(super) fn status_response_meta(_shared: &Shared, e: &ApiError, metadata: Value) -> Resp {
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

pub(super) fn status_response(shared: &Shared, e: &ApiError) -> Resp {
    status_response_meta(shared, e, json!({}))
}

pub(super) fn not_found_path() -> Resp {
    let e = ApiError::new(404, "NotFound", "the server could not find the requested resource");
    json_response(StatusCode::NOT_FOUND, status_value(&e, json!({})))
}

pub(super) fn failure_response(shared: &Shared, f: Failure) -> Resp {
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
