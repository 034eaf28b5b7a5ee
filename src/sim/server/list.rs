//! LIST: selectors, resourceVersion semantics, pagination and continue tokens.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use serde_json::{json, Value};

use super::super::store::{key_of, ApiError, Obj};
use super::super::util::{b64_decode, b64_encode};
use super::super::{ResourceDef, Shared};
use super::response::{full_response, status_response, status_response_meta};
use super::{Query, Resp, Target};
use crate::selector::{FieldOp, FieldSelector, LabelSelector, ShardSelector};

pub(super) struct Selectors {
    labels: LabelSelector,
    fields: FieldSelector,
    /// KEP-5866's `shardSelector`, parsed, with the string as received (echoed in `shardInfo`).
    shard: Option<(ShardSelector, String)>,
}

impl Selectors {
    /// The request's selectors; `sharding`: whether `shardSelector` is honoured (a server
    /// without the feature ignores the parameter, as for any unknown one).
    pub(super) fn parse(def: &ResourceDef, q: &Query, sharding: bool) -> Result<Self, ApiError> {
        let labels = LabelSelector::parse(q.str("labelSelector")).map_err(|e| ApiError::bad_request(e.to_string()))?;
        let fields = FieldSelector::parse(q.str("fieldSelector")).map_err(|e| ApiError::bad_request(e.to_string()))?;
        for r in fields.requirements() {
            let f = r.field();
            if f != "metadata.name" && f != "metadata.namespace" && !def.extra_fields().contains(&f) {
                return Err(ApiError::bad_request(format!("field label not supported: {f}")));
            }
        }
        let shard = match q.get("shardSelector").filter(|s| sharding && !s.trim().is_empty()) {
            None => None,
            Some(raw) => Some((
                raw.parse::<ShardSelector>()
                    .map_err(|e| ApiError::bad_request(e.to_string()))?,
                raw.to_owned(),
            )),
        };
        Ok(Self { labels, fields, shard })
    }
    /// The shard selector as received, when the request has one the server honours.
    pub(super) fn shard_info(&self) -> Option<&str> {
        self.shard.as_ref().map(|(_, raw)| raw.as_str())
    }
    /// The one name the selectors allow, when they are exactly `metadata.name=NAME` (the
    /// registry then reads that single key instead of filtering the collection, as a real API
    /// server does when the path names the namespace or the resource is cluster-scoped).
    pub(super) fn single_name(&self) -> Option<&str> {
        match self.fields.requirements() {
            [r] if self.labels.is_empty()
                && self.shard.is_none()
                && r.field() == "metadata.name"
                && matches!(r.op(), FieldOp::Equals | FieldOp::DoubleEquals) =>
            {
                Some(r.value())
            }
            _ => None,
        }
    }
    pub(super) fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty() && self.shard.is_none()
    }
    pub(super) fn matches(&self, o: &Obj) -> bool {
        o.matches(&self.labels, &self.fields) && self.shard.as_ref().is_none_or(|(s, _)| o.in_shard(s))
    }
}

pub(super) fn parse_rv(s: &str) -> Result<u64, ApiError> {
    s.parse::<u64>().map_err(|_| {
        ApiError::bad_request(format!(
            "resourceVersion: Invalid value: {s:?}: must be a non-negative integer"
        ))
    })
}

pub(super) fn invalid_list_options(causes: &[(&str, &str)]) -> ApiError {
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
pub(super) async fn wait_for_rv(shared: &Shared, rv: u64, wait: Duration) -> bool {
    let mut rx = shared.rv_tx.subscribe();
    let reached = matches!(tokio::time::timeout(wait, rx.wait_for(|&v| v >= rv)).await, Ok(Ok(_)));
    reached
}

pub(super) fn too_large(requested: u64, current: u64) -> ApiError {
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

pub(super) async fn list(shared: &Arc<Shared>, t: &Target, q: &Query, partial: bool) -> Resp {
    match list_inner(shared, t, q, partial).await {
        Ok(r) => r,
        Err(e) => status_response(shared, &e),
    }
}

pub(super) async fn list_inner(shared: &Arc<Shared>, t: &Target, q: &Query, partial: bool) -> Result<Resp, ApiError> {
    let sel = Selectors::parse(&t.def, q, shared.config.sharded_list_watch)?;
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
    // An RV=0 list is served from the watch cache, at the cacher's revision (which lags the
    // global one while only other resources change); any other list reads "etcd".
    let cached = rv == "0" && cont.is_empty() && shared.config.watch_cache;
    let list_rv = match at {
        Some(a) => a,
        None if cached => st.cache_rv.get(t.res).copied().unwrap_or(st.rv),
        None => st.rv,
    };
    let from = format!("{prefix}{start}");
    let mut items: Vec<Arc<Obj>> = Vec::new();
    let mut cont_out = None;
    let mut remaining = None;
    let mut memo_next = None;
    let single = sel
        .single_name()
        .filter(|_| at.is_none() && cont.is_empty() && (t.ns.is_some() || !t.def.namespaced));
    if let Some(name) = single {
        // One key of the current state (an RV=0 list answers from the cache, at its revision).
        let ns = t.ns.as_deref().unwrap_or("");
        items.extend(st.objects[t.res].get(&key_of(&t.def, ns, name)).cloned());
    } else {
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
            if partial {
                json!("PartialObjectMetadataList")
            } else {
                json!(format!("{}List", t.def.kind))
            },
            if partial {
                json!("meta.k8s.io/v1")
            } else {
                json!(t.def.api_version())
            }
        )
        .as_bytes(),
    );
    if let Some(c) = &cont_out {
        out.extend_from_slice(format!(r#","continue":"{c}""#).as_bytes());
        if let Some(n) = remaining.filter(|_| sel.is_empty()) {
            out.extend_from_slice(format!(r#","remainingItemCount":{n}"#).as_bytes());
        }
    }
    // KEP-5866: the list is a filtered subset; the selector is echoed so the client knows.
    if let Some(raw) = sel.shard_info() {
        out.extend_from_slice(format!(r#","shardInfo":{{"selector":{}}}"#, json!(raw)).as_bytes());
    }
    out.extend_from_slice(br#"},"items":["#);
    for (i, o) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        if partial {
            o.write_partial(&mut out);
        } else {
            o.write_item(&mut out);
        }
    }
    out.extend_from_slice(b"]}\n");
    Ok(full_response(StatusCode::OK, Bytes::from(out)))
}
