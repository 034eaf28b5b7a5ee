//! The wire format: watch lines and list bodies, decoded down to the event envelope and each
//! object's metadata. Object bytes are kept as they arrived.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::{ApiStatus, ListPage, WatchEvent};
use crate::object::{scan_object, ObjectError, RawObject, ResourceVersion};

/// A watch line or a LIST body that does not decode.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The line is not a JSON watch event envelope.
    #[error("not a watch event: {0}")]
    NotAWatchEvent(#[source] serde_json::Error),
    /// An event that needs an object has none.
    #[error("{event} event without an object")]
    MissingObject {
        /// The event type.
        event: String,
    },
    /// The event's object is not a Kubernetes object.
    #[error("{event} event: {source}")]
    Object {
        /// The event type.
        event: String,
        /// What is wrong with it.
        #[source]
        source: ObjectError,
    },
    /// A `BOOKMARK` or `ERROR` event's object does not decode.
    #[error("{event} event: {source}")]
    Envelope {
        /// The event type.
        event: String,
        /// The decoder's error.
        #[source]
        source: serde_json::Error,
    },
    /// The event type is none of ADDED, MODIFIED, DELETED, BOOKMARK, ERROR.
    #[error("unknown watch event type {0:?}")]
    UnknownType(String),
    /// The body is not a LIST.
    #[error("not a list: {0}")]
    NotAList(#[source] serde_json::Error),
    /// A LIST item is not a Kubernetes object.
    #[error("item {index}: {source}")]
    Item {
        /// Its position in `items`.
        index: usize,
        /// What is wrong with it.
        #[source]
        source: ObjectError,
    },
    /// A response body that should be one object is not one.
    #[error("{0}")]
    NotAnObject(#[source] ObjectError),
    /// The stream ended inside a line: the last line has no newline and does not decode.
    #[error("truncated stream: {0}")]
    Truncated(#[source] Box<DecodeError>),
    /// A watch line longer than the reader accepts (it would otherwise buffer without bound).
    #[error("watch line longer than {limit} bytes")]
    LineTooLong {
        /// The most bytes a line may have.
        limit: usize,
    },
    /// A streaming list ended without the `k8s.io/initial-events-end` bookmark (a server that
    /// ignores `sendInitialEvents`).
    #[error("streaming list ended without the initial-events-end bookmark")]
    NoInitialEventsEnd,
    /// A source of recorded traffic refused a line (the recording's own error, kept whole).
    #[error("{0}")]
    Recording(#[source] Arc<dyn std::error::Error + Send + Sync>),
}

#[derive(Deserialize)]
struct Line<'a> {
    #[serde(rename = "type", borrow)]
    kind: &'a str,
    #[serde(borrow)]
    object: Option<&'a RawValue>,
    /// Only in recordings (`replay`): when the recorder received the line.
    #[serde(rename = "receivedAt")]
    received_at: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct BookmarkMeta {
    #[serde(default)]
    resource_version: String,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct BookmarkObject {
    #[serde(default)]
    metadata: BookmarkMeta,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct StatusCause {
    #[serde(default)]
    reason: String,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct StatusDetails {
    #[serde(default)]
    causes: Vec<StatusCause>,
    retry_after_seconds: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RawStatus {
    #[serde(default)]
    code: u16,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    message: String,
    #[serde(default)]
    details: Option<StatusDetails>,
}

impl From<RawStatus> for ApiStatus {
    fn from(s: RawStatus) -> Self {
        let details = s.details.unwrap_or_default();
        ApiStatus {
            code: s.code,
            reason: s.reason,
            message: s.message,
            causes: details.causes.into_iter().map(|c| c.reason).collect(),
            retry_after: details.retry_after_seconds.map(std::time::Duration::from_secs),
        }
    }
}

/// Decodes an error body into a status; a body that is not a `Status` keeps its text (cut
/// short) as the message.
pub(crate) fn decode_status(code: u16, body: &[u8]) -> ApiStatus {
    match serde_json::from_slice::<RawStatus>(body) {
        Ok(s) => {
            let mut st = ApiStatus::from(s);
            if st.code == 0 {
                st.code = code;
            }
            st
        }
        Err(_) => ApiStatus {
            code,
            reason: String::new(),
            message: String::from_utf8_lossy(&body[..body.len().min(512)]).trim().to_owned(),
            ..ApiStatus::default()
        },
    }
}

const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// Decodes one watch line (`{"type":"ADDED","object":{…}}`). Unknown event types, missing
/// objects and objects without `metadata.name` are errors (the caller adds the line number).
///
/// ```
/// use durable_informer::source::{decode_watch_line, WatchEvent};
/// let ev = decode_watch_line(br#"{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"3"}}}"#).unwrap();
/// assert!(matches!(ev, WatchEvent::Added(o) if o.meta.name == "a"));
/// ```
pub fn decode_watch_line(line: &[u8]) -> Result<WatchEvent, DecodeError> {
    decode_watch_bytes(&Bytes::copy_from_slice(line))
}

/// [`decode_watch_line`] over received bytes: an object's bytes are a slice of `line`, not a
/// copy, and the object is parsed once (envelope aside), by [`scan_object`].
pub(crate) fn decode_watch_bytes(line: &Bytes) -> Result<WatchEvent, DecodeError> {
    decode_recorded_bytes(line).map(|(ev, _)| ev)
}

/// [`decode_watch_bytes`] that also returns a recording's `receivedAt` (unix milliseconds): the
/// one watch-line decoder, shared by the live source and replay.
pub(crate) fn decode_recorded_bytes(line: &Bytes) -> Result<(WatchEvent, Option<u64>), DecodeError> {
    let parsed: Line<'_> = serde_json::from_slice(line).map_err(DecodeError::NotAWatchEvent)?;
    let event = || parsed.kind.to_owned();
    if !matches!(parsed.kind, "ADDED" | "MODIFIED" | "DELETED" | "BOOKMARK" | "ERROR") {
        return Err(DecodeError::UnknownType(parsed.kind.to_owned()));
    }
    let object = parsed
        .object
        .ok_or_else(|| DecodeError::MissingObject { event: event() })?;
    let raw = object.get().as_bytes();
    let obj = || {
        let bytes = line.slice_ref(raw);
        scan_object(&bytes)
            .map(|scanned| RawObject::scanned(bytes.clone(), scanned))
            .map_err(|source| DecodeError::Object { event: event(), source })
    };
    let envelope = |source| DecodeError::Envelope { event: event(), source };
    let ev = match parsed.kind {
        "ADDED" => WatchEvent::Added(obj()?),
        "MODIFIED" => WatchEvent::Modified(obj()?),
        "DELETED" => WatchEvent::Deleted(obj()?),
        "BOOKMARK" => {
            // A bookmark carries only a resourceVersion; for Pods the rest is a hollow object
            // (`"spec":{"containers":null}`) that must not be decoded as one.
            let b: BookmarkObject = serde_json::from_slice(raw).map_err(envelope)?;
            WatchEvent::Bookmark {
                resource_version: ResourceVersion(b.metadata.resource_version),
                initial_events_end: b
                    .metadata
                    .annotations
                    .get(INITIAL_EVENTS_END)
                    .is_some_and(|v| v == "true"),
            }
        }
        "ERROR" => {
            let s: RawStatus = serde_json::from_slice(raw).map_err(envelope)?;
            WatchEvent::Error(s.into())
        }
        other => return Err(DecodeError::UnknownType(other.to_owned())),
    };
    Ok((ev, parsed.received_at))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListMeta {
    #[serde(default)]
    resource_version: String,
    #[serde(rename = "continue")]
    continue_token: Option<String>,
    remaining_item_count: Option<i64>,
    shard_info: Option<ShardInfo>,
}

/// KEP-5866's `metadata.shardInfo` of a list the server filtered by `shardSelector`.
#[derive(Deserialize)]
struct ShardInfo {
    #[serde(default)]
    selector: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListBody<'a> {
    #[serde(borrow)]
    api_version: Option<&'a str>,
    #[serde(borrow)]
    kind: Option<&'a str>,
    metadata: ListMeta,
    #[serde(borrow)]
    items: Option<Vec<&'a RawValue>>,
}

/// Decodes a LIST body. Items of a LIST carry no `apiVersion`/`kind` on a real server; they
/// are added from the list's own (`PodList` → `Pod`), so stored objects always decode as typed
/// objects and read like watch objects.
pub fn decode_list(body: &[u8]) -> Result<ListPage, DecodeError> {
    decode_list_bytes(&Bytes::copy_from_slice(body))
}

/// [`decode_list`] over received bytes: each item is parsed once, and its bytes are a slice of
/// `body` unless `apiVersion`/`kind` must be added.
pub(crate) fn decode_list_bytes(body: &Bytes) -> Result<ListPage, DecodeError> {
    let list: ListBody<'_> = serde_json::from_slice(body).map_err(DecodeError::NotAList)?;
    let item_kind = list.kind.and_then(|k| k.strip_suffix("List")).filter(|k| !k.is_empty());
    let mut items = Vec::with_capacity(list.items.as_ref().map_or(0, Vec::len));
    for (i, raw) in list.items.unwrap_or_default().into_iter().enumerate() {
        let bytes = raw.get().as_bytes();
        let scanned = scan_object(bytes).map_err(|source| DecodeError::Item { index: i, source })?;
        let item = match (scanned.has_type_meta, list.api_version, item_kind) {
            (false, Some(av), Some(kind)) if bytes.first() == Some(&b'{') => {
                let rest = &bytes[1..];
                let sep = if rest.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'}') {
                    ""
                } else {
                    ","
                };
                let mut out = Vec::with_capacity(bytes.len() + av.len() + kind.len() + 32);
                out.extend_from_slice(format!(r#"{{"apiVersion":"{av}","kind":"{kind}"{sep}"#).as_bytes());
                // Everything after the opening brace moved by the prefix, less that brace.
                let shift = out.len() - 1;
                out.extend_from_slice(rest);
                RawObject::scanned(Bytes::from(out), scanned.shifted(shift))
            }
            _ => RawObject::scanned(body.slice_ref(bytes), scanned),
        };
        items.push(item);
    }
    Ok(ListPage {
        items,
        resource_version: ResourceVersion(list.metadata.resource_version),
        continue_token: list.metadata.continue_token.filter(|c| !c.is_empty()),
        remaining: list.metadata.remaining_item_count,
        shard_info: list.metadata.shard_info.map(|s| s.selector),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(name: &str) -> Vec<u8> {
        std::fs::read(format!("{}/tests/data/k8s-wire/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
    }

    #[test]
    fn every_recorded_watch_line_decodes() {
        for file in ["configmaps-watch.jsonl", "pods-watch.jsonl"] {
            let body = wire(file);
            let mut bookmarks = 0;
            for line in body.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                match decode_watch_line(line).unwrap() {
                    WatchEvent::Bookmark { resource_version, .. } => {
                        assert!(resource_version.as_u64().is_some());
                        bookmarks += 1;
                    }
                    WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) => {
                        assert_eq!(o.meta.namespace.as_deref(), Some("rec"));
                    }
                    WatchEvent::Error(s) => panic!("unexpected error {s}"),
                }
            }
            assert_eq!(bookmarks, 1, "{file}");
        }
    }

    #[test]
    fn the_recorded_410_error_events_are_recognised() {
        for file in [
            "watch-410-watchcache-too-old.http",
            "watch-410-etcd-compacted-nocache.http",
        ] {
            let body = wire(file);
            let text = String::from_utf8(body).unwrap();
            let line = text.lines().find(|l| l.starts_with("{\"type\"")).unwrap();
            match decode_watch_line(line.as_bytes()).unwrap() {
                WatchEvent::Error(s) => {
                    assert!(s.is_gone(), "{s}");
                    assert_eq!((s.code, s.reason.as_str()), (410, "Expired"));
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn the_recorded_504_is_a_too_large_rv() {
        let text = String::from_utf8(wire("list-504-too-large-rv.http")).unwrap();
        let body = &text[text.find("{").unwrap()..];
        let s = decode_status(504, body.as_bytes());
        assert!(s.is_too_large_rv(), "{s:?}");
        assert_eq!(s.code, 504);
    }

    #[test]
    fn list_items_get_kind_and_api_version() {
        let page = decode_list(&wire("pods-list.json")).unwrap();
        assert_eq!(page.resource_version.as_str(), "268");
        for item in &page.items {
            let v: serde_json::Value = serde_json::from_slice(&item.bytes).unwrap();
            assert_eq!(v["kind"], "Pod");
            assert_eq!(v["apiVersion"], "v1");
            let _: k8s_openapi::api::core::v1::Pod = serde_json::from_slice(&item.bytes).unwrap();
        }
        let page = decode_list(&wire("configmaps-rec-page1-limit2.json")).unwrap();
        assert_eq!(page.items.len(), 2);
        assert!(page.continue_token.is_some());
        assert!(page.remaining.is_some());
    }

    /// The LIST path inserts `apiVersion`/`kind` and shifts the scanned `managedFields`
    /// position; the cut must still land on it in every real item.
    #[test]
    fn a_null_or_odd_type_field_in_a_list_item_is_not_duplicated() {
        let page = decode_list(
            br#"{"apiVersion":"v1","kind":"ConfigMapList","metadata":{"resourceVersion":"1"},"items":[{"apiVersion":null,"metadata":{"name":"a"}},{"kind":1,"metadata":{"name":"b"}}]}"#,
        )
        .unwrap();
        for item in &page.items {
            // Read back as stored: a duplicated member would make every later scan fail.
            crate::object::RawObject::from_json(item.bytes.clone()).unwrap();
            assert_eq!(
                memchr::memmem::find_iter(&item.bytes, b"\"apiVersion\"").count(),
                usize::from(item.meta.name == "a")
            );
        }
    }

    #[test]
    fn objects_must_be_json_objects() {
        // An array serde's derived struct would take member by member, name and all.
        let err = decode_watch_line(br#"{"type":"ADDED","object":[{"name":"a"},"v1","Pod"]}"#).unwrap_err();
        assert!(
            matches!(&err, DecodeError::Object { event, source: ObjectError::NotAnObject } if event == "ADDED"),
            "{err}"
        );
        assert!(decode_list(br#"{"kind":"ConfigMapList","metadata":{},"items":[[{"name":"a"},"v1","Pod"]]}"#).is_err());
    }

    #[test]
    fn bad_lines_are_errors() {
        assert!(decode_watch_line(b"{").is_err());
        assert!(matches!(
            decode_watch_line(br#"{"type":"SURPRISE","object":{"metadata":{"name":"a"}}}"#),
            Err(DecodeError::UnknownType(t)) if t == "SURPRISE"
        ));
        // An unknown type is named as such even without an object.
        assert!(matches!(
            decode_watch_line(br#"{"type":"SURPRISE"}"#),
            Err(DecodeError::UnknownType(_))
        ));
        assert!(matches!(
            decode_watch_line(br#"{"type":"ADDED","object":{"kind":"Pod"}}"#),
            Err(DecodeError::Object {
                source: ObjectError::MissingName,
                ..
            })
        ));
        assert!(matches!(
            decode_watch_line(br#"{"type":"ADDED"}"#),
            Err(DecodeError::MissingObject { event }) if event == "ADDED"
        ));
        assert!(matches!(decode_list(b"[]"), Err(DecodeError::NotAList(_))));
        let err = decode_list(br#"{"kind":"ConfigMapList","metadata":{},"items":[{"metadata":{"name":"a"}},{}]}"#)
            .unwrap_err();
        assert!(
            matches!(
                err,
                DecodeError::Item {
                    index: 1,
                    source: ObjectError::MissingName
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn empty_objects_in_lists_get_valid_json() {
        let page = decode_list(br#"{"apiVersion":"v1","kind":"ConfigMapList","metadata":{"resourceVersion":"1"},"items":[{"metadata":{"name":"a"}}]}"#).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&page.items[0].bytes).unwrap();
        assert_eq!(v["kind"], "ConfigMap");
    }
}
