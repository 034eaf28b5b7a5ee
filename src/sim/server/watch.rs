//! WATCH: where a watch starts, the events and bookmarks it sends, and per-watch faults.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http::{header, HeaderValue, Response};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::super::store::{ApiError, EventKind, Obj};
use super::super::{ResourceDef, Shared};
use super::list::{invalid_list_options, parse_rv, too_large, wait_for_rv, Selectors};
use super::response::status_response;
use super::{Query, Resp, Target};

pub(super) enum Start {
    /// Synthetic ADDED events for the current state first (`end_bookmark`: streaming list).
    Initial { end_bookmark: bool },
    /// Events after this revision.
    From(u64),
}

pub(super) struct WatchPlan {
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
    delay_replay: Option<Duration>,
    /// Objects as `PartialObjectMetadata` (a metadata-only client).
    partial: bool,
    /// A lagging watch cache's revision: the initial state is listed at it.
    cache_at: Option<u64>,
}

pub(super) async fn watch(shared: &Arc<Shared>, t: &Target, q: &Query, partial: bool, cache_at: Option<u64>) -> Resp {
    // Subscribed before the plan reads any state: a restore that lands while the request
    // waits or while its task starts must still end the stream.
    let mut epoch = shared.epoch_tx.subscribe();
    epoch.mark_unchanged();
    match plan_watch(shared, t, q) {
        Ok(mut plan) => {
            plan.partial = partial;
            plan.cache_at = cache_at;
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

pub(super) fn plan_watch(shared: &Shared, t: &Target, q: &Query) -> Result<WatchPlan, ApiError> {
    let cfg = &shared.config;
    let sel = Selectors::parse(&t.def, q, cfg.sharded_list_watch)?;
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
    let delay_replay = faults.lock().delay_replay.filter(|_| matches!(start, Start::From(_)));
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
        delay_replay,
        partial: false,
        cache_at: None,
    })
}

/// The `BOOKMARK` event for a resource: only the resourceVersion is meaningful; the rest is the
/// empty object's shape as a real server serializes it.
pub(super) fn bookmark_line(def: &ResourceDef, rv: u64, initial_end: bool) -> Vec<u8> {
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

pub(super) fn event_line(out: &mut Vec<u8>, kind: &str, obj: &Obj) {
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    out.extend_from_slice(&obj.full);
    out.extend_from_slice(b"}\n");
}

/// [`event_line`], with the object as `PartialObjectMetadata` when `partial`.
fn event_line_as(out: &mut Vec<u8>, kind: &str, obj: &Obj, partial: bool) {
    if !partial {
        return event_line(out, kind, obj);
    }
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    obj.write_partial(out);
    out.extend_from_slice(b"}\n");
}

/// [`bookmark_line`], as `PartialObjectMetadata` when `partial`.
fn bookmark_line_as(def: &ResourceDef, rv: u64, initial_end: bool, partial: bool) -> Vec<u8> {
    if !partial {
        return bookmark_line(def, rv, initial_end);
    }
    let annotations = if initial_end {
        r#","annotations":{"k8s.io/initial-events-end":"true"}"#
    } else {
        ""
    };
    format!("{{\"type\":\"BOOKMARK\",\"object\":{{\"kind\":\"PartialObjectMetadata\",\"apiVersion\":\"meta.k8s.io/v1\",\"metadata\":{{\"resourceVersion\":\"{rv}\",\"creationTimestamp\":null{annotations}}}}}}}\n").into_bytes()
}

pub(super) fn expired_line(watch_cache: bool, rv: u64, compact_rv: u64) -> Vec<u8> {
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
pub(super) fn visible(sel: &Selectors, kind: EventKind, obj: &Obj, prev: Option<&Obj>) -> Option<&'static str> {
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

pub(super) const CHUNK: usize = 256 * 1024;
pub(super) const BATCH_EVENTS: usize = 4096;

/// Writes into the response channel, counting and applying the per-watch faults.
pub(super) struct Sink {
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

/// Whether the server restarted (or a backup was restored) since the watch began. Read with
/// the state's lock held, which the restart moves the epoch under: a watch then sends nothing
/// written after the restart.
fn restarted(epoch_rx: &tokio::sync::watch::Receiver<u64>) -> bool {
    !matches!(epoch_rx.has_changed(), Ok(false))
}

pub(super) async fn run_watch(
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

    if let Some(d) = plan.delay_replay {
        tokio::select! {
            () = tx.closed() => return,
            () = tokio::time::sleep(d) => {}
        }
    }
    // Position: every event with rv <= pos has been considered.
    let mut pos = match plan.start {
        Start::From(n) => n,
        Start::Initial { end_bookmark } => {
            let (objs, rv) = {
                let mut st = shared.lock();
                if restarted(&epoch_rx) {
                    return;
                }
                st.maintain();
                // A lagging cache lists an older state, never one the history no longer has.
                let rv = plan.cache_at.map_or(st.rv, |at| at.clamp(st.compact_rv, st.rv));
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
                event_line_as(&mut sink.buf, "ADDED", o, plan.partial);
                if !sink.event(at).await {
                    return;
                }
            }
            if end_bookmark {
                sink.buf
                    .extend_from_slice(&bookmark_line_as(&plan.def, rv, true, plan.partial));
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
    // A bookmark carries the cacher's revision of this resource, and only when it is past
    // where the watch started: the cacher drops every event, bookmarks included, at or below
    // the watch's resourceVersion.
    let start_rv = pos;
    let mut cache_rv = pos;
    loop {
        // Drain the history after `pos`.
        let drained = {
            let mut st = shared.lock();
            if restarted(&epoch_rx) {
                return;
            }
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
                if !more {
                    cache_rv = st.cache_rv.get(plan.res).copied().unwrap_or(pos).min(pos);
                }
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
                event_line_as(&mut sink.buf, t, obj, plan.partial);
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
                if caught_up && cache_rv > start_rv {
                    sink.buf.extend_from_slice(&bookmark_line_as(&plan.def, cache_rv, false, plan.partial));
                    shared.counters.bookmarks.fetch_add(1, Ordering::Relaxed);
                    if !sink.flush().await {
                        return;
                    }
                }
            }
        }
    }
}
