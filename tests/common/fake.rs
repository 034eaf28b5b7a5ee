//! An in-memory list/watch source that behaves like an API server (global RV, history with a
//! compaction point, pagination, 410 on compacted RVs) and records every request, so tests can
//! assert the exact sequence of RVs the reflector asks for (client-go's reflector tests do the
//! same). Faults are scripted per request.

#![allow(dead_code)]

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use durable_informer::object::{RawObject, ResourceVersion};
use durable_informer::source::{
    ApiStatus, DecodeError, ListPage, ListRequest, Source, SourceError, WatchEvent, WatchRequest, WatchStream,
};
use futures::StreamExt;
use tokio::sync::mpsc;

/// A scripted fault, consumed by the next request of its kind.
#[derive(Debug, Clone)]
pub enum Fault {
    /// The next LIST answers with this status.
    List(ApiStatus),
    /// The next LIST with a continue token (a page after the first) answers with this status.
    ListContinue(ApiStatus),
    /// The next WATCH answers with this HTTP status.
    Watch(ApiStatus),
    /// The next WATCH sends this ERROR event after `after` events, then ends.
    WatchError { after: usize, status: ApiStatus },
    /// The next WATCH sends a malformed line after `after` events, then ends.
    WatchMalformed { after: usize },
    /// The next WATCH ends after `after` events.
    WatchDrop { after: usize },
    /// The next WATCH sends `after` events, then nothing more (it never ends by itself).
    WatchStall { after: usize },
    /// Like `WatchError`, but the object `delete` is deleted on the server just before the
    /// error is sent (a change between a failed list attempt and its retry).
    WatchErrorAfterDelete {
        after: usize,
        status: ApiStatus,
        delete: String,
    },
    /// The next LIST with a continue token finds the server moved on: `delete` was deleted and
    /// the history compacted, so the token expired (410).
    ListContinueExpired { delete: String },
}

#[derive(Default)]
struct State {
    rv: u64,
    objects: BTreeMap<String, (u64, Vec<u8>)>,
    history: Vec<(u64, &'static str, Vec<u8>)>,
    compacted: u64,
    requests: Vec<(Instant, String)>,
    faults: VecDeque<Fault>,
    watchers: Vec<mpsc::UnboundedSender<Result<WatchEvent, SourceError>>>,
    identity: Option<String>,
    streaming: bool,
    /// The label selector `scope()` reports (the fake does not filter: `bump_rv` stands in
    /// for a change the selector hides).
    label_selector: Option<String>,
}

/// The fake server; clones share state.
#[derive(Clone, Default)]
pub struct Fake {
    state: Arc<Mutex<State>>,
}

pub fn status(code: u16, reason: &str, message: &str) -> ApiStatus {
    ApiStatus {
        code,
        reason: reason.into(),
        message: message.into(),
        ..ApiStatus::default()
    }
}

/// A ConfigMap; `meta` holds more metadata members (each after a comma), `data` is the raw
/// JSON of its `data`.
fn json(name: &str, rv: u64, meta: &str, data: &str) -> Vec<u8> {
    format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"{rv}","managedFields":[{{"manager":"test"}}]{meta}}},"data":{data}}}"#
    )
    .into_bytes()
}

fn data_v(value: &str) -> String {
    format!(r#"{{"v":"{value}"}}"#)
}

fn event(kind: &str, bytes: &[u8]) -> WatchEvent {
    let o = RawObject::from_json(bytes.to_vec()).unwrap();
    match kind {
        "ADDED" => WatchEvent::Added(o),
        "MODIFIED" => WatchEvent::Modified(o),
        _ => WatchEvent::Deleted(o),
    }
}

impl Fake {
    pub fn new() -> Self {
        let f = Self::default();
        f.state.lock().unwrap().rv = 100;
        f.state.lock().unwrap().identity = Some("fake-uid@fake".into());
        f
    }

    pub fn set_identity(&self, id: &str) {
        self.state.lock().unwrap().identity = Some(id.into());
    }

    pub fn set_streaming(&self, on: bool) {
        self.state.lock().unwrap().streaming = on;
    }

    /// Records an event; `value` is the object's metadata members and data (for a delete, its
    /// final state).
    fn record(&self, kind: &'static str, name: &str, value: (&str, &str)) {
        let mut s = self.state.lock().unwrap();
        s.rv += 1;
        let rv = s.rv;
        let bytes = json(name, rv, value.0, value.1);
        match kind {
            "ADDED" | "MODIFIED" => {
                s.objects.insert(name.into(), (rv, bytes.clone()));
            }
            _ => {
                s.objects.remove(name);
            }
        }
        s.history.push((rv, kind, bytes.clone()));
        let ev = event(kind, &bytes);
        s.watchers.retain(|w| w.send(Ok(ev.clone())).is_ok());
    }

    pub fn upsert(&self, name: &str, value: &str) {
        self.upsert_raw(name, "", &data_v(value));
    }

    /// Like [`upsert`](Self::upsert) with more metadata members (`meta`, each after a comma,
    /// as in `,"generation":2`) and `data` as raw JSON.
    pub fn upsert_raw(&self, name: &str, meta: &str, data: &str) {
        let kind = if self.state.lock().unwrap().objects.contains_key(name) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        self.record(kind, name, (meta, data));
    }

    pub fn delete(&self, name: &str) {
        self.delete_raw(name, "", &data_v("gone"));
    }

    /// Like [`delete`](Self::delete) with the final state's metadata members and data.
    pub fn delete_raw(&self, name: &str, meta: &str, data: &str) {
        if self.state.lock().unwrap().objects.contains_key(name) {
            self.record("DELETED", name, (meta, data));
        }
    }

    /// Sends the current state of `name` again as MODIFIED with its unchanged RV (a duplicate
    /// event, as after a watch reconnect) without recording it in the history.
    pub fn resend(&self, name: &str) {
        let mut s = self.state.lock().unwrap();
        let Some((_, bytes)) = s.objects.get(name).cloned() else {
            return;
        };
        let ev = event("MODIFIED", &bytes);
        s.watchers.retain(|w| w.send(Ok(ev.clone())).is_ok());
    }

    /// Moves the cluster RV without an event for this resource (another resource changed).
    /// Reports `selector` as the scope's label selector from now on.
    pub fn set_label_selector(&self, selector: &str) {
        self.state.lock().unwrap().label_selector = Some(selector.to_owned());
    }

    pub fn bump_rv(&self) {
        self.state.lock().unwrap().rv += 1;
    }

    /// Compacts the history up to the current RV.
    pub fn compact(&self) {
        let mut s = self.state.lock().unwrap();
        s.compacted = s.rv;
        s.history.clear();
    }

    /// Ends every open watch.
    pub fn drop_watches(&self) {
        self.state.lock().unwrap().watchers.clear();
    }

    /// Sends a bookmark at the current RV to every watch.
    pub fn bookmark(&self) {
        let mut s = self.state.lock().unwrap();
        let rv = ResourceVersion(s.rv.to_string());
        s.watchers.retain(|w| {
            w.send(Ok(WatchEvent::Bookmark {
                resource_version: rv.clone(),
                initial_events_end: false,
            }))
            .is_ok()
        });
    }

    pub fn fault(&self, f: Fault) {
        self.state.lock().unwrap().faults.push_back(f);
    }

    pub fn current_rv(&self) -> u64 {
        self.state.lock().unwrap().rv
    }

    /// Moves the RV counter back (etcd restored from an older backup).
    pub fn restore_backup_to(&self, rv: u64) {
        let mut s = self.state.lock().unwrap();
        s.rv = rv;
        s.history.retain(|(r, _, _)| *r <= rv);
        s.objects.retain(|_, (r, _)| *r <= rv);
        s.compacted = s.compacted.min(rv);
    }

    /// Every request so far: `list rv=… limit=… continue=…` or
    /// `watch rv=…[ initial-events] timeout=…`.
    pub fn requests(&self) -> Vec<String> {
        self.timed_requests().into_iter().map(|(_, r)| r).collect()
    }

    /// Every request so far with the time it arrived.
    pub fn timed_requests(&self) -> Vec<(Instant, String)> {
        self.state.lock().unwrap().requests.clone()
    }

    /// Every request with the watch's ` timeout=…` left out, for asserting the RVs asked for.
    pub fn requests_without_timeouts(&self) -> Vec<String> {
        self.requests()
            .into_iter()
            .map(|r| match r.find(" timeout=") {
                Some(i) => r[..i].to_owned(),
                None => r,
            })
            .collect()
    }

    /// The `timeoutSeconds` of every WATCH so far.
    pub fn watch_timeouts(&self) -> Vec<u32> {
        self.requests()
            .iter()
            .filter_map(|r| r.split_once(" timeout=").map(|(_, t)| t.parse().unwrap()))
            .collect()
    }

    pub fn full_lists(&self) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.starts_with("list") && !r.contains("limit=1 ") && r.ends_with("continue="))
            .count()
    }

    pub fn objects(&self) -> BTreeMap<String, u64> {
        self.state
            .lock()
            .unwrap()
            .objects
            .iter()
            .map(|(k, (rv, _))| (format!("ns/{k}"), *rv))
            .collect()
    }

    fn take_fault(&self, pred: impl Fn(&Fault) -> bool) -> Option<Fault> {
        let mut s = self.state.lock().unwrap();
        let pos = s.faults.iter().position(pred)?;
        s.faults.remove(pos)
    }
}

impl Source for Fake {
    async fn list(&self, req: ListRequest) -> Result<ListPage, SourceError> {
        if req.revision_only {
            // One resource only: its watch-cache revision is the current one.
            let mut s = self.state.lock().unwrap();
            s.requests.push((Instant::now(), "list rv=0 revision-only".into()));
            return Ok(ListPage {
                items: Vec::new(),
                resource_version: s.rv.to_string().into(),
                continue_token: None,
                remaining: None,
                shard_info: None,
            });
        }
        self.state.lock().unwrap().requests.push((
            Instant::now(),
            format!(
                "list rv={} limit={} continue={}",
                req.resource_version.as_ref().map_or("", |rv| rv.as_str()),
                req.limit.map(|l| l.to_string()).unwrap_or_default(),
                req.continue_token.as_deref().unwrap_or("")
            ),
        ));
        if let Some(Fault::List(st)) = self.take_fault(|f| matches!(f, Fault::List(_))) {
            return Err(SourceError::Api {
                resource: "configmaps".into(),
                status: st,
            });
        }
        if req.continue_token.is_some() {
            if let Some(Fault::ListContinue(st)) = self.take_fault(|f| matches!(f, Fault::ListContinue(_))) {
                return Err(SourceError::Api {
                    resource: "configmaps".into(),
                    status: st,
                });
            }
            if let Some(Fault::ListContinueExpired { delete }) =
                self.take_fault(|f| matches!(f, Fault::ListContinueExpired { .. }))
            {
                self.delete(&delete);
                self.compact();
            }
        }
        let s = self.state.lock().unwrap();
        // continue token = "rv:start-after-key"
        let (list_rv, after) = match &req.continue_token {
            Some(t) => {
                let (rv, key) = t.split_once(':').unwrap();
                let rv: u64 = rv.parse().unwrap();
                if rv < s.compacted {
                    return Err(SourceError::Api {
                        resource: "configmaps".into(),
                        status: status(410, "Expired", "continue token expired"),
                    });
                }
                (rv, Some(key.to_owned()))
            }
            None => (s.rv, None),
        };
        let limit = req.limit.unwrap_or(u32::MAX) as usize;
        let items: Vec<(&String, &(u64, Vec<u8>))> = s
            .objects
            .iter()
            .filter(|(k, _)| after.as_ref().is_none_or(|a| *k > a))
            .collect();
        let page: Vec<RawObject> = items
            .iter()
            .take(limit)
            .map(|(_, (_, b))| RawObject::from_json(b.clone()).unwrap())
            .collect();
        let continue_token = (items.len() > limit).then(|| format!("{list_rv}:{}", items[limit - 1].0));
        Ok(ListPage {
            items: page,
            resource_version: ResourceVersion(list_rv.to_string()),
            continue_token,
            remaining: None,
            shard_info: None,
        })
    }

    async fn watch(&self, req: WatchRequest) -> Result<WatchStream, SourceError> {
        self.state.lock().unwrap().requests.push((
            Instant::now(),
            format!(
                "watch rv={}{} timeout={}",
                req.resource_version,
                if req.send_initial_events { " initial-events" } else { "" },
                req.timeout_secs
            ),
        ));
        if let Some(Fault::Watch(st)) = self.take_fault(|f| matches!(f, Fault::Watch(_))) {
            return Err(SourceError::Api {
                resource: "configmaps".into(),
                status: st,
            });
        }
        let mut s = self.state.lock().unwrap();
        let mut initial: Vec<Result<WatchEvent, SourceError>> = Vec::new();
        if req.send_initial_events {
            if !s.streaming {
                return Err(SourceError::Api {
                    resource: "configmaps".into(),
                    status: status(422, "Invalid", "sendInitialEvents is forbidden"),
                });
            }
            for (_, b) in s.objects.values() {
                initial.push(Ok(event("ADDED", b)));
            }
            initial.push(Ok(WatchEvent::Bookmark {
                resource_version: ResourceVersion(s.rv.to_string()),
                initial_events_end: true,
            }));
        } else {
            let from: u64 = req.resource_version.as_u64().unwrap_or(0);
            if from > s.rv {
                // A future RV: silence, like a real server.
            } else if from < s.compacted {
                initial.push(Ok(WatchEvent::Error(status(
                    410,
                    "Expired",
                    &format!("too old resource version: {from} ({})", s.compacted),
                ))));
                return Ok(futures::stream::iter(initial).boxed());
            } else {
                for (rv, kind, b) in &s.history {
                    if *rv > from {
                        initial.push(Ok(event(kind, b)));
                    }
                }
            }
        }
        let (tx, rx) = mpsc::unbounded_channel();
        s.watchers.push(tx);
        drop(s);
        let live = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (e, rx)) });
        let mut stream = futures::stream::iter(initial).chain(live).boxed();
        let fault = self.take_fault(|f| {
            matches!(
                f,
                Fault::WatchError { .. }
                    | Fault::WatchMalformed { .. }
                    | Fault::WatchDrop { .. }
                    | Fault::WatchStall { .. }
                    | Fault::WatchErrorAfterDelete { .. }
            )
        });
        if let Some(Fault::WatchStall { after }) = fault {
            return Ok(stream.take(after).chain(futures::stream::pending()).boxed());
        }
        if let Some(Fault::WatchErrorAfterDelete { after, status, delete }) = fault {
            let fake = self.clone();
            let tail = futures::stream::once(async move {
                fake.delete(&delete);
                Ok(WatchEvent::Error(status))
            });
            return Ok(stream.take(after).chain(tail).boxed());
        }
        if let Some(f) = fault {
            let (after, tail): (usize, Vec<Result<WatchEvent, SourceError>>) = match f {
                Fault::WatchError { after, status } => (after, vec![Ok(WatchEvent::Error(status))]),
                Fault::WatchMalformed { after } => (
                    after,
                    vec![Err(SourceError::decode(
                        "configmaps",
                        Some(after as u64 + 1),
                        DecodeError::UnknownType("NOT-A-WATCH-EVENT".into()),
                    ))],
                ),
                Fault::WatchDrop { after } => (after, vec![]),
                _ => unreachable!(),
            };
            stream = stream.take(after).chain(futures::stream::iter(tail)).boxed();
        }
        Ok(stream)
    }

    async fn cluster_identity(&self) -> Result<Option<String>, SourceError> {
        Ok(self.state.lock().unwrap().identity.clone())
    }

    fn resource(&self) -> String {
        "configmaps".into()
    }

    fn scope(&self) -> durable_informer::object::ScopeSpec {
        let mut scope = durable_informer::object::ScopeSpec::new("", "v1", "configmaps");
        scope.label_selector = self.state.lock().unwrap().label_selector.clone();
        scope
    }
}
