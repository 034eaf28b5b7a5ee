//! The replay source and driver: a recording served through the [`Source`] trait, so the
//! reflector, the writer and the handlers run exactly as against a live server.
//!
//! A feeder thread reads and decodes the recording (blocking file I/O and zstd stay off the
//! async runtime) and hands events over a bounded channel, so memory is bounded by the channel
//! and the longest line, never by the recording's length. The leading ADDED run is served as
//! the initial list (as a streaming list ending with an initial-events-end bookmark, or as LIST
//! pages); the rest as one watch that stays open, silent, once the recording is exhausted.

mod consumer;
mod feed;
mod options;

use consumer::{Consumer, Guard, Progress, Shared};
use feed::{Feed, FeedSummary, Feeder};
pub use options::{ReplayOptions, ReplayReport, Speed};

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use tokio::sync::{mpsc, watch};

use super::format::{event_rv, type_meta_of, RecordingReader};
use super::{scope_of, ReplayError};
use crate::object::{ResourceVersion, ScopeSpec};
use crate::reflector::{Phase, Reflector, ReflectorConfig, ReflectorError, ReflectorStatus};
use crate::source::{ApiStatus, ListPage, ListRequest, Source, SourceError, WatchEvent, WatchRequest, WatchStream};
use crate::store::DurableStore;

/// A recording served as a [`Source`]: no network, no cluster identity.
///
/// Build an [`Informer`](crate::informer::Informer) over it to test a controller offline, or
/// use [`replay_into`]. Serve it to one reflector only, into a fresh scope.
pub struct ReplaySource {
    shared: Arc<Shared>,
    scope: ScopeSpec,
    options: ReplayOptions,
}

impl std::fmt::Debug for ReplaySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplaySource")
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

/// Waits for a replay's end; from [`ReplaySource::handle`].
pub struct ReplayHandle {
    progress: Arc<Progress>,
}

impl std::fmt::Debug for ReplayHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayHandle").finish_non_exhaustive()
    }
}

const CHUNK: usize = 256;
const CHANNEL_CHUNKS: usize = 16;

impl ReplaySource {
    /// Opens a recording file (plain or zstd). Starts a reader thread at once; blocking (it
    /// reads up to the first object to derive the scope).
    pub fn open(path: impl AsRef<Path>, options: ReplayOptions) -> Result<Self, ReplayError> {
        Self::open_all([path.as_ref().to_owned()], options)
    }

    /// Opens several files replayed one after the other (rotated recordings).
    pub fn open_all(paths: impl IntoIterator<Item = PathBuf>, options: ReplayOptions) -> Result<Self, ReplayError> {
        let reader = RecordingReader::open_all(paths)?.on_malformed(options.on_malformed);
        Self::from_reader(reader, options)
    }

    /// Replays what `reader` reads (its malformed-line policy is replaced by the options').
    pub fn from_reader(reader: RecordingReader, options: ReplayOptions) -> Result<Self, ReplayError> {
        let mut reader = reader.on_malformed(options.on_malformed);
        let mut prefix = Vec::new();
        let scope = match options.scope.clone() {
            Some(s) => s,
            None => loop {
                let path = reader.position().0.map(Path::to_owned).unwrap_or_default();
                let Some(ev) = reader.next_event()? else {
                    return Err(ReplayError::NoScope { path });
                };
                let derived = match &ev.event {
                    WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) => type_meta_of(&o.bytes),
                    _ => None,
                };
                prefix.push(ev);
                if let Some((av, kind)) = derived {
                    break scope_of(&av, &kind);
                }
            },
        };
        let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
        let (done, _) = watch::channel(false);
        let progress = Arc::new(Progress {
            state: Mutex::default(),
            done,
        });
        let feeder = Feeder {
            tx,
            chunk: Vec::with_capacity(CHUNK),
            options: options.clone(),
            summary: FeedSummary::default(),
            initial: true,
            initial_max: None,
            initial_cut: false,
            last: None,
            pace: None,
            gone: None,
        };
        std::thread::Builder::new()
            .name("replay-feed".into())
            .spawn(move || feeder.run(reader, prefix))
            .map_err(|source| ReplayError::Io {
                path: PathBuf::from("<replay-feed thread>"),
                line: None,
                source,
            })?;
        let consumer = Consumer {
            rx,
            buf: VecDeque::new(),
            initial_done: false,
            finished: false,
            last_rv: ResourceVersion::default(),
            initial: 0,
            events: 0,
            progress: progress.clone(),
        };
        Ok(Self {
            shared: Arc::new(Shared {
                consumer: Mutex::new(Some(consumer)),
                progress,
            }),
            scope,
            options,
        })
    }

    /// A handle to wait for the end of the replay (several may be taken).
    #[must_use]
    pub fn handle(&self) -> ReplayHandle {
        ReplayHandle {
            progress: self.shared.progress.clone(),
        }
    }

    /// The options it was opened with.
    #[must_use]
    pub fn options(&self) -> &ReplayOptions {
        &self.options
    }
}

fn pending_forever<T>() -> futures::future::Pending<T> {
    futures::future::pending()
}

impl Source for ReplaySource {
    async fn list(&self, req: ListRequest) -> Result<ListPage, SourceError> {
        let mut g = Guard::take(&self.shared)?;
        let c = g.c();
        if c.initial_done || c.finished || req.revision_only {
            // The probe of a resume (or a relist): the recording's current RV, no objects.
            return Ok(ListPage {
                items: Vec::new(),
                resource_version: c.last_rv.clone(),
                continue_token: None,
                remaining: None,
                shard_info: None,
            });
        }
        let limit = req.limit.map_or(usize::MAX, |l| l.max(1) as usize);
        let mut items = Vec::new();
        loop {
            match c.next().await {
                Feed::Initial(o) => items.push(c.initial_object(o)),
                Feed::InitialEnd(rv) => {
                    c.end_initial(&rv);
                    return Ok(ListPage {
                        items,
                        resource_version: rv,
                        continue_token: None,
                        remaining: None,
                        shard_info: None,
                    });
                }
                Feed::Event(ev) => {
                    // Not sent by the feeder before the end of the initial run.
                    c.buf.push_front(Feed::Event(ev));
                    c.initial_done = true;
                }
                Feed::Done(r) => {
                    if let Some(e) = c.finish(r) {
                        return Err(e);
                    }
                    c.initial_done = true;
                }
            }
            if items.len() >= limit || c.initial_done {
                let done = c.initial_done;
                return Ok(ListPage {
                    items,
                    resource_version: if done { c.last_rv.clone() } else { "0".into() },
                    continue_token: (!done).then(|| "replay".to_owned()),
                    remaining: None,
                    shard_info: None,
                });
            }
        }
    }

    async fn watch(&self, req: WatchRequest) -> Result<WatchStream, SourceError> {
        let mut g = Guard::take(&self.shared)?;
        if req.send_initial_events {
            if g.c().initial_done {
                return Err(SourceError::Api {
                    resource: self.resource(),
                    status: ApiStatus {
                        code: 422,
                        reason: "Invalid".into(),
                        message: "the recording's initial state was already served".into(),
                        ..ApiStatus::default()
                    },
                });
            }
            return Ok(futures::stream::unfold(g, |mut g| async move {
                let c = g.c();
                if c.initial_done || c.finished {
                    return None;
                }
                let item = match c.next().await {
                    Feed::Initial(o) => Ok(WatchEvent::Added(c.initial_object(o))),
                    Feed::InitialEnd(rv) => {
                        c.end_initial(&rv);
                        Ok(WatchEvent::Bookmark {
                            resource_version: rv,
                            initial_events_end: true,
                        })
                    }
                    Feed::Event(ev) => {
                        c.buf.push_front(Feed::Event(ev));
                        return None;
                    }
                    Feed::Done(r) => match c.finish(r) {
                        Some(e) => Err(e),
                        None => return None,
                    },
                };
                Some((item, g))
            })
            .boxed());
        }
        Ok(futures::stream::unfold(g, |mut g| async move {
            let c = g.c();
            loop {
                if c.finished {
                    // The recording is exhausted: a watch that stays open and silent.
                    return pending_forever().await;
                }
                let item = match c.next().await {
                    Feed::Initial(o) => Ok(WatchEvent::Added(c.initial_object(o))),
                    Feed::InitialEnd(rv) => {
                        c.end_initial(&rv);
                        continue;
                    }
                    Feed::Event(ev) => {
                        if let WatchEvent::Error(status) = &ev {
                            // The feeder sends a 410 only when a new initial state follows: the
                            // reflector's relist is served from it.
                            if status.is_gone() {
                                c.initial_done = false;
                            }
                        }
                        c.events += 1;
                        if let Some(rv) = event_rv(&ev) {
                            c.last_rv.clone_from(rv);
                        }
                        Ok(ev)
                    }
                    Feed::Done(r) => match c.finish(r) {
                        Some(e) => Err(e),
                        None => continue,
                    },
                };
                return Some((item, g));
            }
        })
        .boxed())
    }

    async fn cluster_identity(&self) -> Result<Option<String>, SourceError> {
        Ok(None)
    }

    fn resource(&self) -> String {
        if self.scope.group.is_empty() {
            self.scope.resource.clone()
        } else {
            format!("{}.{}", self.scope.resource, self.scope.group)
        }
    }

    fn scope(&self) -> ScopeSpec {
        self.scope.clone()
    }
}

impl ReplayHandle {
    /// Waits until the recording was read to its end (or to a stop point), then until the
    /// reflector whose status is `status` has committed everything it was served (watch batches
    /// reach the disk within `StoreConfig::fsync_delay`; `Writer::flush` waits for that).
    /// Fails with the recording's error (naming the line), or when the reflector stops first.
    ///
    /// Use it with an informer built over the [`ReplaySource`]:
    /// `handle.wait_applied(informer.status()).await`.
    pub async fn wait_applied(
        &self,
        mut status: watch::Receiver<ReflectorStatus>,
    ) -> Result<ReplayReport, ReplayError> {
        let mut done = self.progress.done.subscribe();
        tokio::select! {
            r = done.wait_for(|d| *d) => { let _ = r; }
            stopped = status.wait_for(|s| s.phase == Phase::Stopped) => {
                let last = stopped.ok().and_then(|s| s.last_error.clone()).unwrap_or_default();
                if let Some(e) = self.progress.take_error() {
                    return Err(e);
                }
                return Err(ReplayError::Failed(format!("the reflector stopped before the end of the recording: {last}")));
            }
        }
        if let Some(e) = self.progress.take_error() {
            return Err(e);
        }
        let report = self.progress.lock().report.clone();
        let target = report.last_rv.clone();
        let reached = status
            .wait_for(|s| s.committed_rv.as_ref() == Some(&target) || s.phase == Phase::Stopped)
            .await
            .map(|s| s.committed_rv.as_ref() == Some(&target))
            .unwrap_or(false);
        if !reached {
            let last = status.borrow().last_error.clone().unwrap_or_default();
            return Err(ReplayError::Failed(format!(
                "the reflector stopped before committing resourceVersion {target}: {last}"
            )));
        }
        Ok(report)
    }

    /// True once the recording was read to its end (or to a stop point, or an error).
    #[must_use]
    pub fn is_exhausted(&self) -> bool {
        self.progress.lock().done
    }
}

/// Replays a recording into `db` through a reflector (into a fresh scope: it fails with
/// [`ReplayError::ScopeNotEmpty`] otherwise), and returns once everything is durably committed.
/// Any reflector error (a refused write, an object over the size limit, …) fails the replay.
///
/// ## Durability
///
/// A replay is a bulk load: its batches commit without waiting for the disk, and one durable
/// commit at the end makes all of them durable before this returns. A crash midway leaves the
/// database at an earlier committed state (never a mix), with the scope not yet synced; since
/// a replay only goes into an empty scope, it is redone from the start (into a fresh database,
/// or after [`crate::store::Writer::reset_scope`]). A [`ReplaySource`] driven by an
/// [`crate::informer::Informer`] instead commits each batch durably, like a live watch.
pub async fn replay_into(db: &DurableStore, source: ReplaySource) -> Result<ReplayReport, ReplayError> {
    let writer = db.writer();
    let spec = source.scope.clone();
    let scope = writer.register_scope(&spec).await?;
    let store = db.store(scope);
    let record = store.record()?;
    if record.rv.is_some() || record.object_count > 0 {
        return Err(ReplayError::ScopeNotEmpty(spec.canonical()));
    }
    let handle = source.handle();
    let config = ReflectorConfig {
        transform: source.options.transform.clone(),
        max_batch: source.options.max_batch.max(1),
        ..ReflectorConfig::default()
    };
    let (err_tx, mut err_rx) = watch::channel::<Option<ReflectorError>>(None);
    let reflector = Reflector::new(source, writer.clone(), store, config)
        .relaxed_commits()
        .on_error(Arc::new(move |e: &ReflectorError| {
            err_tx.send_if_modified(|slot| {
                if slot.is_none() {
                    *slot = Some(e.clone());
                    true
                } else {
                    false
                }
            });
        }));
    let status = reflector.status();
    let (stop_tx, stop_rx) = watch::channel(false);
    let task = tokio::spawn(reflector.run(stop_rx));
    let result = tokio::select! {
        r = handle.wait_applied(status) => r,
        first = err_rx.wait_for(Option::is_some) => {
            let first = first.ok().and_then(|e| e.clone());
            match handle.progress.take_error() {
                Some(e) => Err(e),
                None => Err(first.map_or_else(|| ReplayError::Failed("reflector error".into()), ReplayError::from)),
            }
        }
    };
    let _ = stop_tx.send(true);
    let ended = task.await;
    let result = result?;
    match ended {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e.into()),
        Err(e) => return Err(ReplayError::Failed(format!("the reflector task failed: {e}"))),
    }
    if let Some(e) = err_rx.borrow().clone() {
        return Err(e.into());
    }
    // The batches were committed without an fsync: one durable commit covers them all.
    writer.flush().await?;
    Ok(result)
}
