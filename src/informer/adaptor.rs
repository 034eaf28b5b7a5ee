//! kube-runtime interop: an informer as a stream of `kube::runtime::watcher::Event<K>`, so
//! `kube::runtime::reflector` and `Controller::for_stream` (kube-runtime's
//! `unstable-runtime-stream-control` feature, which the application enables) can consume it; `tests/informer_sim.rs` runs such a Controller.

use std::collections::VecDeque;
use std::time::Duration;

use futures::Stream;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;

use super::Informer;
use crate::object::ObjectKey;
use crate::store::{DamagedEntry, DeltaKind, LogEntry, LogReader, ObjectEntry, ScopeId, Seq, Store};

enum Phase {
    Start,
    /// Listing: the encoded key of the last row read, and the position the list started at.
    Initial(Option<Vec<u8>>, Seq),
    Live(Seq),
}

struct State<K> {
    store: Store,
    log: LogReader,
    scope: ScopeId,
    committed: tokio::sync::watch::Receiver<Seq>,
    phase: Phase,
    queue: VecDeque<Result<watcher::Event<K>, watcher::Error>>,
    /// The pause before the next retry after a store error (doubles up to [`RETRY_MAX`]).
    retry: Duration,
    /// Set by an error: taken after the error item was yielded, before the retry.
    pause: Option<Duration>,
}

const RETRY_FIRST: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// A store error (or a blocking read that did not finish) as the stream's error item: `list`
/// for the initial list, the watch otherwise, as kube's watcher reports its own.
fn store_error(e: impl std::fmt::Display, list: bool) -> watcher::Error {
    let source = kube::Error::Service(format!("the informer's store: {e}").into());
    if list {
        watcher::Error::InitialListFailed(source)
    } else {
        watcher::Error::WatchFailed(source)
    }
}

impl<K> State<K> {
    /// Logs `e` and queues it as an error item; the retry waits for the pause.
    fn failed(&mut self, e: watcher::Error) {
        tracing::warn!(scope = %self.scope, error = %e, retry_in = ?self.retry, "watcher stream: reading the store failed");
        self.queue.push_back(Err(e));
        self.pause = Some(self.retry);
        self.retry = (self.retry * 2).min(RETRY_MAX);
    }
}

/// Decodes a stored object; one that does not decode as `K` is an error item of the stream
/// (kube's own watcher does the same), never silently left out.
fn decode<K: DeserializeOwned>(bytes: &[u8]) -> Result<K, watcher::Error> {
    serde_json::from_slice(bytes).map_err(|e| watcher::Error::WatchFailed(kube::Error::SerdeError(e)))
}

/// The error item standing for a damaged stored row (an object row or a log entry), which is
/// skipped: the stream goes on past it.
fn damaged(what: &str, key: Option<&ObjectKey>, error: &crate::store::StoreError) -> watcher::Error {
    let key = key.map_or_else(|| "an object".to_owned(), ToString::to_string);
    let message = format!("{what} of {key} is damaged and was skipped: {error}");
    watcher::Error::WatchFailed(kube::Error::ReadEvents(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        message,
    )))
}

/// The informer's store as an initial list (`Init`, `InitApply`…, `InitDone`) followed by its
/// live changes (`Apply`, `Delete`), read from the durable log. Relists that find deletes
/// produce `Delete` with the last known state. A stored object that does not decode as `K`
/// (a CRD's schema changed, say), and a damaged stored row or log entry, is an `Err` item in
/// its place; the stream goes on.
/// A store read that fails (the database closed or reopening after an I/O error) is logged
/// and is an `Err` item too (`InitialListFailed` or `WatchFailed`), retried after a pause
/// that doubles from 200 ms to 5 s.
///
/// Feed it to `kube::runtime::reflector` and `Controller::for_stream` (kube-runtime's
/// `unstable-runtime-stream-control` feature, which the application enables; this crate
/// needs no unstable kube feature):
///
/// ```no_run
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// use durable_informer::informer::{watcher_stream, Informer};
/// use futures::StreamExt;
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube::runtime::controller::{Action, Controller};
/// use kube::runtime::{reflector, WatchStreamExt};
///
/// async fn reconcile(cm: Arc<ConfigMap>, _ctx: Arc<()>) -> Result<Action, std::convert::Infallible> {
///     println!("reconcile {:?}", cm.metadata.name);
///     Ok(Action::await_change())
/// }
///
/// # async fn f(informer: Informer<ConfigMap>) -> Result<(), durable_informer::informer::InformerError> {
/// informer.start();
/// informer.wait_for_sync().await?;
/// let (reader, writer) = reflector::store();
/// let stream = reflector(writer, watcher_stream(&informer)).applied_objects();
/// Controller::for_stream(stream, reader)
///     .run(reconcile, |_, _, _| Action::requeue(Duration::from_secs(5)), Arc::new(()))
///     .for_each(|_| async {})
///     .await;
/// # Ok(()) }
/// ```
pub fn watcher_stream<K>(informer: &Informer<K>) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
where
    K: DeserializeOwned + Clone + Send + Sync + 'static,
{
    let state = State::<K> {
        store: informer.inner.store.clone(),
        log: informer.inner.log.clone(),
        scope: informer.inner.scope,
        committed: informer.inner.writer.committed(),
        phase: Phase::Start,
        queue: VecDeque::new(),
        retry: RETRY_FIRST,
        pause: None,
    };
    futures::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(ev) = st.queue.pop_front() {
                return Some((ev, st));
            }
            if let Some(p) = st.pause.take() {
                tokio::time::sleep(p).await;
            }
            match std::mem::replace(&mut st.phase, Phase::Start) {
                Phase::Start => {
                    let store = st.store.clone();
                    let pos = tokio::task::spawn_blocking(move || store.snapshot().and_then(|s| s.position())).await;
                    let pos = match pos {
                        Ok(Ok(p)) => p,
                        Ok(Err(e)) => {
                            st.failed(store_error(e, true));
                            continue;
                        }
                        Err(e) => {
                            st.failed(store_error(e, true));
                            continue;
                        }
                    };
                    st.retry = RETRY_FIRST;
                    st.queue.push_back(Ok(watcher::Event::Init));
                    st.phase = Phase::Initial(None, pos);
                }
                Phase::Initial(after, pos) => {
                    // Pages are read from the live store: objects changed after `pos` are
                    // re-applied from the log later, which a reflector store absorbs.
                    let store = st.store.clone();
                    let from = after.clone();
                    let page = tokio::task::spawn_blocking(move || {
                        store
                            .snapshot()
                            .and_then(|s| s.list_entries_after(from.as_deref(), 256))
                    })
                    .await;
                    let (page, last) = match page {
                        Ok(Ok(page)) => page,
                        Ok(Err(e)) => {
                            st.phase = Phase::Initial(after, pos);
                            st.failed(store_error(e, true));
                            continue;
                        }
                        Err(e) => {
                            st.phase = Phase::Initial(after, pos);
                            st.failed(store_error(e, true));
                            continue;
                        }
                    };
                    st.retry = RETRY_FIRST;
                    let Some(last) = last else {
                        st.queue.push_back(Ok(watcher::Event::InitDone));
                        st.phase = Phase::Live(pos);
                        continue;
                    };
                    for entry in page {
                        st.queue.push_back(match entry {
                            ObjectEntry::Object(o) => decode::<K>(&o.bytes).map(watcher::Event::InitApply),
                            ObjectEntry::Damaged { key, error } => Err(damaged("the stored row", key.as_ref(), &error)),
                        });
                    }
                    st.phase = Phase::Initial(Some(last), pos);
                }
                Phase::Live(cursor) => {
                    let log = st.log.clone();
                    let scope = st.scope;
                    let read = tokio::task::spawn_blocking(move || {
                        log.read_scope_entries_after_contiguous(cursor, 256, scope)
                    })
                    .await;
                    let (records, scanned) = match read {
                        Ok(Ok(r)) => r,
                        Ok(Err(e @ crate::store::StoreError::LogCompacted { .. })) => {
                            // Entries were compacted before this stream read them: start again
                            // with Init/InitApply/InitDone, which a kube reflector store treats
                            // as a relist (deletes included).
                            tracing::warn!(error = %e, "watcher stream restarts from the current state");
                            st.phase = Phase::Start;
                            continue;
                        }
                        Ok(Err(e)) => {
                            st.phase = Phase::Live(cursor);
                            st.failed(store_error(e, false));
                            continue;
                        }
                        Err(e) => {
                            st.phase = Phase::Live(cursor);
                            st.failed(store_error(e, false));
                            continue;
                        }
                    };
                    st.retry = RETRY_FIRST;
                    st.phase = Phase::Live(scanned);
                    if records.is_empty() && scanned == cursor {
                        if st.committed.changed().await.is_err() {
                            return None;
                        }
                        continue;
                    }
                    for entry in records {
                        let r = match entry {
                            LogEntry::Record(r) => r,
                            // Only its previous state is damaged: the change itself is whole.
                            LogEntry::Damaged(DamagedEntry { partial: Some(r), .. }) => r,
                            LogEntry::Damaged(d) => {
                                st.queue.push_back(Err(damaged(
                                    &format!("log entry {}", d.seq.0),
                                    d.key.as_ref(),
                                    &d.error,
                                )));
                                continue;
                            }
                        };
                        let ev = match r.kind {
                            DeltaKind::Added | DeltaKind::Updated | DeltaKind::Replaced => {
                                r.object.map(|b| decode::<K>(&b).map(watcher::Event::Apply))
                            }
                            DeltaKind::Deleted => {
                                r.object.or(r.old).map(|b| decode::<K>(&b).map(watcher::Event::Delete))
                            }
                            DeltaKind::Sync => None,
                        };
                        st.queue.extend(ev);
                    }
                }
            }
        }
    })
}
