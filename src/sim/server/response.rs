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
    full_response(StatusCode::NOT_ACCEPTABLE, status_body(&e, &json!({})))
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

/// A `Status` body, serialized as the value `json!` would build (keys in order) without
/// building it: every refused write answers one.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusBody<'a> {
    api_version: &'static str,
    code: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<&'a Value>,
    kind: &'static str,
    message: &'a str,
    metadata: &'a Value,
    reason: &'static str,
    status: &'static str,
}

fn status_body(e: &ApiError, metadata: &Value) -> Bytes {
    let body = StatusBody {
        api_version: "v1",
        code: e.code,
        details: e.details.as_ref(),
        kind: "Status",
        message: &e.message,
        metadata,
        reason: e.reason,
        status: "Failure",
    };
    Bytes::from(serde_json::to_vec(&body).unwrap_or_default())
}

pub(super) fn status_response_meta(_shared: &Shared, e: &ApiError, metadata: Value) -> Resp {
    let code = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = full_response(code, status_body(e, &metadata));
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
    full_response(StatusCode::NOT_FOUND, status_body(&e, &json!({})))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_body_is_the_status_object_serialized() {
        let mut e = ApiError::new(409, "Conflict", "the object has been modified");
        for details in [None, Some(json!({"name": "a", "kind": "foos", "retryAfterSeconds": 1}))] {
            e.details = details.clone();
            let meta = json!({"resourceVersion": "7"});
            let mut want = json!({
                "kind": "Status", "apiVersion": "v1", "metadata": meta, "status": "Failure",
                "message": e.message, "reason": e.reason, "code": e.code
            });
            if let (Some(d), Some(o)) = (details, want.as_object_mut()) {
                o.insert("details".into(), d);
            }
            let want = serde_json::to_vec(&want).expect("serializes");
            assert_eq!(
                status_body(&e, &meta).as_ref(),
                want.as_slice(),
                "{}",
                String::from_utf8_lossy(&want)
            );
        }
    }
}
