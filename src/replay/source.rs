//! The replay source and driver: a recording served through the [`Source`] trait, so the
//! reflector, the writer and the handlers run exactly as against a live server.
//!
//! A feeder thread reads and decodes the recording (blocking file I/O and zstd stay off the
//! async runtime) and hands events over a bounded channel, so memory is bounded by the channel
//! and the longest line, never by the recording's length. The leading ADDED run is served as
//! the initial list (as a streaming list ending with an initial-events-end bookmark, or as LIST
//! pages); the rest as one watch that stays open, silent, once the recording is exhausted.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::{mpsc, watch};

use super::format::{event_rv, type_meta_of, RecordedEvent, RecordingReader};
use super::{scope_of, MalformedPolicy, ReplayError, RvRegressionPolicy};
use crate::object::{RawObject, ResourceVersion, ScopeSpec};
use crate::reflector::{Phase, Reflector, ReflectorConfig, ReflectorError, ReflectorStatus, Transform};
use crate::source::{
    ApiStatus, DecodeError, ListPage, ListRequest, Source, SourceError, WatchEvent, WatchRequest, WatchStream,
};
use crate::store::DurableStore;

/// How fast a replay goes.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Speed {
    /// As fast as the store takes it (default).
    #[default]
    Max,
    /// Real time multiplied by this factor (2.0 = twice as fast), from the recorded receive
    /// times; lines without a receive time are not delayed.
    Factor(f64),
}

/// How to replay a recording.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// Malformed lines: fail (default) or skip and count.
    pub on_malformed: MalformedPolicy,
    /// resourceVersions going backwards: fail (default) or skip the event with a warning.
    pub on_rv_regression: RvRegressionPolicy,
    /// Pace.
    pub speed: Speed,
    /// Stop after the last event whose resourceVersion is not newer than this (integer RVs).
    /// Objects of the initial ADDED run newer than it are left out.
    pub stop_at_rv: Option<ResourceVersion>,
    /// Stop before the first event received after this time (unix milliseconds). Objects of
    /// the initial ADDED run received after it are left out.
    pub stop_at_ms: Option<u64>,
    /// The scope; derived from the first object's `apiVersion`/`kind` when `None`.
    pub scope: Option<ScopeSpec>,
    /// The transform [`replay_into`] runs the reflector with. Default: nothing dropped, so
    /// stored objects are the recorded bytes exactly (not the reflector's default, which drops
    /// `metadata.managedFields`).
    pub transform: Transform,
    /// Most deltas per batch handed to the writer by [`replay_into`] (default 1000).
    pub max_batch: usize,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        Self {
            on_malformed: MalformedPolicy::Fail,
            on_rv_regression: RvRegressionPolicy::Fail,
            speed: Speed::Max,
            stop_at_rv: None,
            stop_at_ms: None,
            scope: None,
            transform: Transform {
                drop_managed_fields: false,
                ..Transform::default()
            },
            max_batch: 1000,
        }
    }
}

impl ReplayOptions {
    /// Sets the malformed-line policy.
    #[must_use]
    pub fn on_malformed(mut self, policy: MalformedPolicy) -> Self {
        self.on_malformed = policy;
        self
    }

    /// Sets the RV-regression policy.
    #[must_use]
    pub fn on_rv_regression(mut self, policy: RvRegressionPolicy) -> Self {
        self.on_rv_regression = policy;
        self
    }

    /// Sets the pace.
    #[must_use]
    pub fn speed(mut self, speed: Speed) -> Self {
        self.speed = speed;
        self
    }

    /// Stops at a resourceVersion (inclusive).
    #[must_use]
    pub fn stop_at_rv(mut self, rv: impl Into<ResourceVersion>) -> Self {
        self.stop_at_rv = Some(rv.into());
        self
    }

    /// Stops at a receive time (unix milliseconds, inclusive).
    #[must_use]
    pub fn stop_at_ms(mut self, ms: u64) -> Self {
        self.stop_at_ms = Some(ms);
        self
    }

    /// Sets the scope instead of deriving it.
    #[must_use]
    pub fn scope(mut self, scope: ScopeSpec) -> Self {
        self.scope = Some(scope);
        self
    }

    /// Sets the transform used by [`replay_into`].
    #[must_use]
    pub fn transform(mut self, transform: Transform) -> Self {
        self.transform = transform;
        self
    }
}

/// What a replay did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Objects of the initial ADDED run (served as the initial list).
    pub initial_objects: u64,
    /// Watch events delivered after it (bookmarks included).
    pub events: u64,
    /// The resourceVersion the scope reached.
    pub last_rv: ResourceVersion,
    /// Malformed lines skipped ([`MalformedPolicy::Skip`]).
    pub skipped_malformed: u64,
    /// Events skipped because their RV went backwards ([`RvRegressionPolicy::Warn`]).
    pub rv_regressions: u64,
    /// `ERROR` events in the recording that were not replayed: any but a 410 followed by the
    /// state a relist found (the reflector cannot relist against a recording that has no
    /// answer).
    pub error_events: u64,
    /// 410 `ERROR` events followed by a new initial state, replayed as relists.
    pub relists: u64,
    /// The recording ends cut off (a crash while recording): a truncated last line was
    /// dropped, or a compressed file ends mid-frame.
    pub truncated_tail: bool,
    /// The replay stopped at [`ReplayOptions::stop_at_rv`] / [`ReplayOptions::stop_at_ms`]
    /// before the end of the recording.
    pub stopped_early: bool,
}

#[derive(Debug, Default)]
struct FeedSummary {
    skipped_malformed: u64,
    rv_regressions: u64,
    error_events: u64,
    relists: u64,
    truncated_tail: bool,
    stopped_early: bool,
}

enum Feed {
    Initial(RawObject),
    InitialEnd(ResourceVersion),
    Event(WatchEvent),
    Done(Result<FeedSummary, ReplayError>),
}

#[derive(Default)]
struct ProgressState {
    done: bool,
    report: ReplayReport,
    /// Shared with the [`SourceError`] the reflector got.
    error: Option<Arc<ReplayError>>,
    error_text: Option<String>,
}

struct Progress {
    state: Mutex<ProgressState>,
    done: watch::Sender<bool>,
}

impl Progress {
    fn lock(&self) -> std::sync::MutexGuard<'_, ProgressState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn take_error(&self) -> Option<ReplayError> {
        let mut s = self.lock();
        // The typed error when nobody else holds it (the reflector drops its copy when it
        // stops); its text otherwise, and for every later call.
        match s.error.take().map(Arc::try_unwrap) {
            Some(Ok(e)) => Some(e),
            _ => s.error_text.clone().map(ReplayError::Failed),
        }
    }
}

struct Consumer {
    rx: mpsc::Receiver<Vec<Feed>>,
    buf: VecDeque<Feed>,
    initial_done: bool,
    finished: bool,
    last_rv: ResourceVersion,
    initial: u64,
    events: u64,
    progress: Arc<Progress>,
}

impl Consumer {
    async fn next(&mut self) -> Feed {
        loop {
            if let Some(f) = self.buf.pop_front() {
                return f;
            }
            match self.rx.recv().await {
                Some(chunk) => self.buf.extend(chunk),
                None => {
                    return Feed::Done(Err(ReplayError::Failed(
                        "the recording reader stopped unexpectedly".into(),
                    )))
                }
            }
        }
    }

    /// Records the end of the feed; returns the error to hand to the reflector, if any.
    fn finish(&mut self, result: Result<FeedSummary, ReplayError>) -> Option<SourceError> {
        self.finished = true;
        let mut s = self.progress.lock();
        s.done = true;
        s.report.initial_objects = self.initial;
        s.report.events = self.events;
        s.report.last_rv = self.last_rv.clone();
        let err = match result {
            Ok(sum) => {
                s.report.skipped_malformed = sum.skipped_malformed;
                s.report.rv_regressions = sum.rv_regressions;
                s.report.error_events = sum.error_events;
                s.report.relists = sum.relists;
                s.report.truncated_tail = sum.truncated_tail;
                s.report.stopped_early = sum.stopped_early;
                None
            }
            Err(e) => {
                let line = match &e {
                    ReplayError::Malformed { line, .. }
                    | ReplayError::UnknownEventType { line, .. }
                    | ReplayError::RvRegression { line, .. } => Some(*line),
                    _ => None,
                };
                s.error_text = Some(e.to_string());
                let e = Arc::new(e);
                s.error = Some(e.clone());
                Some(SourceError::decode("recording", line, DecodeError::Recording(e)))
            }
        };
        drop(s);
        self.progress.done.send_replace(true);
        err
    }
}

struct Shared {
    consumer: Mutex<Option<Consumer>>,
    progress: Arc<Progress>,
}

/// Holds the consumer while a list or watch uses it, and gives it back when dropped.
struct Guard {
    shared: Arc<Shared>,
    consumer: Option<Consumer>,
}

impl Guard {
    fn take(shared: &Arc<Shared>) -> Result<Self, SourceError> {
        let consumer = shared.consumer.lock().unwrap_or_else(PoisonError::into_inner).take();
        match consumer {
            Some(c) => Ok(Self {
                shared: shared.clone(),
                consumer: Some(c),
            }),
            None => Err(SourceError::Transport {
                resource: "recording".into(),
                detail: "the recording is already being read by another request".into(),
            }),
        }
    }

    fn c(&mut self) -> &mut Consumer {
        // Invariant: `consumer` is `Some` from `take` until `drop`.
        self.consumer
            .as_mut()
            .expect("the consumer is held until the guard drops")
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(c) = self.consumer.take() {
            *self.shared.consumer.lock().unwrap_or_else(PoisonError::into_inner) = Some(c);
        }
    }
}

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
        if c.initial_done || c.finished {
            // The probe of a resume (or a relist): the recording's current RV, no objects.
            return Ok(ListPage {
                items: Vec::new(),
                resource_version: c.last_rv.clone(),
                continue_token: None,
                remaining: None,
            });
        }
        let limit = req.limit.map_or(usize::MAX, |l| l.max(1) as usize);
        let mut items = Vec::new();
        loop {
            match c.next().await {
                Feed::Initial(o) => {
                    c.initial += 1;
                    items.push(o);
                }
                Feed::InitialEnd(rv) => {
                    c.initial_done = true;
                    c.last_rv = rv.clone();
                    return Ok(ListPage {
                        items,
                        resource_version: rv,
                        continue_token: None,
                        remaining: None,
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
                    Feed::Initial(o) => {
                        c.initial += 1;
                        Ok(WatchEvent::Added(o))
                    }
                    Feed::InitialEnd(rv) => {
                        c.initial_done = true;
                        c.last_rv = rv.clone();
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
                    Feed::Initial(o) => {
                        c.initial += 1;
                        Ok(WatchEvent::Added(o))
                    }
                    Feed::InitialEnd(rv) => {
                        c.initial_done = true;
                        c.last_rv = rv;
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

/// Reads the recording on its own thread and feeds the consumer in chunks.
struct Feeder {
    tx: mpsc::Sender<Vec<Feed>>,
    chunk: Vec<Feed>,
    options: ReplayOptions,
    summary: FeedSummary,
    initial: bool,
    initial_max: Option<ResourceVersion>,
    initial_cut: bool,
    last: Option<ResourceVersion>,
    pace: Option<(Instant, u64)>,
    /// A 410 ERROR waiting for the next line: followed by a new initial state (what the
    /// recorder and export write after an expired watch) it is replayed as a relist.
    gone: Option<RecordedEvent>,
}

enum Flow {
    Continue,
    Stop,
}

/// The newer of two resourceVersions (integers compared; otherwise the later one wins).
fn newer(a: Option<ResourceVersion>, b: &ResourceVersion) -> ResourceVersion {
    match a {
        Some(a) if b.is_older_than(&a) => a,
        _ => b.clone(),
    }
}

impl Feeder {
    fn run(mut self, mut reader: RecordingReader, prefix: Vec<RecordedEvent>) {
        let result = self.run_inner(&mut reader, prefix);
        if let Some(ev) = self.gone.take() {
            self.skip_error(&ev);
        }
        let result = result.map(|()| {
            let mut s = std::mem::take(&mut self.summary);
            s.skipped_malformed = reader.skipped();
            s.truncated_tail = reader.truncated_tail();
            s
        });
        if self.initial {
            self.end_initial(None);
        }
        self.chunk.push(Feed::Done(result));
        self.flush();
    }

    fn run_inner(&mut self, reader: &mut RecordingReader, prefix: Vec<RecordedEvent>) -> Result<(), ReplayError> {
        for ev in prefix {
            if matches!(self.handle(ev)?, Flow::Stop) {
                return Ok(());
            }
        }
        while let Some(ev) = reader.next_event()? {
            if matches!(self.handle(ev)?, Flow::Stop) {
                return Ok(());
            }
        }
        Ok(())
    }

    fn flush(&mut self) -> bool {
        if self.chunk.is_empty() {
            return true;
        }
        self.tx.blocking_send(std::mem::take(&mut self.chunk)).is_ok()
    }

    fn push(&mut self, f: Feed) -> bool {
        self.chunk.push(f);
        if self.chunk.len() >= CHUNK {
            self.flush()
        } else {
            true
        }
    }

    fn end_initial(&mut self, rv: Option<ResourceVersion>) -> bool {
        self.initial = false;
        let rv = rv
            .filter(|r| !r.is_empty())
            .or_else(|| self.initial_max.clone())
            .unwrap_or_else(|| "0".into());
        self.last = Some(rv.clone());
        self.push(Feed::InitialEnd(rv))
    }

    fn skip_error(&mut self, ev: &RecordedEvent) {
        if let WatchEvent::Error(status) = &ev.event {
            tracing::warn!(path = %ev.path.display(), line = ev.line, %status, "ERROR event in the recording; not replayed");
        }
        self.summary.error_events += 1;
    }

    fn handle(&mut self, ev: RecordedEvent) -> Result<Flow, ReplayError> {
        let closed = |ok: bool| if ok { Flow::Continue } else { Flow::Stop };
        if let Some(gone) = self.gone.take() {
            if matches!(
                ev.event,
                WatchEvent::Added(_)
                    | WatchEvent::Bookmark {
                        initial_events_end: true,
                        ..
                    }
            ) {
                // The watch expired and the recording holds the state the relist found: the
                // reflector gets the 410 and relists from that state, as it did live.
                self.summary.relists += 1;
                if !self.push(Feed::Event(gone.event)) {
                    return Ok(Flow::Stop);
                }
                self.initial = true;
                self.initial_max = None;
            } else {
                self.skip_error(&gone);
            }
        }
        if self.initial {
            // Received after the stop time: left out, like an object past the stop RV.
            let late = matches!((self.options.stop_at_ms, ev.received_at_ms), (Some(stop), Some(at)) if at > stop);
            match ev.event {
                WatchEvent::Added(o) => {
                    let rv = &o.meta.resource_version;
                    if late || self.options.stop_at_rv.as_ref().is_some_and(|s| s.is_older_than(rv)) {
                        self.initial_cut = true;
                        return Ok(Flow::Continue);
                    }
                    self.initial_max = Some(newer(self.initial_max.take(), rv));
                    return Ok(closed(self.push(Feed::Initial(o))));
                }
                WatchEvent::Bookmark {
                    resource_version,
                    initial_events_end: true,
                } => {
                    self.initial_cut |= late;
                    let rv = if self.initial_cut { None } else { Some(resource_version) };
                    let ok = self.end_initial(rv);
                    if self.initial_cut {
                        self.summary.stopped_early = true;
                        return Ok(Flow::Stop);
                    }
                    return Ok(closed(ok));
                }
                event => {
                    if !self.end_initial(None) {
                        return Ok(Flow::Stop);
                    }
                    if self.initial_cut {
                        self.summary.stopped_early = true;
                        return Ok(Flow::Stop);
                    }
                    return self.live(RecordedEvent { event, ..ev });
                }
            }
        }
        self.live(ev)
    }

    fn live(&mut self, ev: RecordedEvent) -> Result<Flow, ReplayError> {
        if let WatchEvent::Error(status) = &ev.event {
            if status.is_gone() {
                self.gone = Some(ev);
            } else {
                self.skip_error(&ev);
            }
            return Ok(Flow::Continue);
        }
        let Some(rv) = event_rv(&ev.event).cloned() else {
            return Ok(Flow::Continue);
        };
        if let Some(stop) = &self.options.stop_at_rv {
            if stop.is_older_than(&rv) {
                self.summary.stopped_early = true;
                return Ok(Flow::Stop);
            }
        }
        if let (Some(stop), Some(at)) = (self.options.stop_at_ms, ev.received_at_ms) {
            if at > stop {
                self.summary.stopped_early = true;
                return Ok(Flow::Stop);
            }
        }
        if let Some(last) = &self.last {
            if rv.is_older_than(last) {
                match self.options.on_rv_regression {
                    RvRegressionPolicy::Fail => {
                        return Err(ReplayError::RvRegression {
                            path: ev.path,
                            line: ev.line,
                            previous: last.clone(),
                            found: rv,
                        })
                    }
                    RvRegressionPolicy::Warn => {
                        tracing::warn!(path = %ev.path.display(), line = ev.line, previous = %last, found = %rv,
                            "resourceVersion goes backwards; event skipped");
                        self.summary.rv_regressions += 1;
                        return Ok(Flow::Continue);
                    }
                }
            }
        }
        let paced = self.pace(ev.received_at_ms);
        self.last = Some(rv);
        let mut ok = self.push(Feed::Event(ev.event));
        if paced {
            ok &= self.flush();
        }
        Ok(if ok { Flow::Continue } else { Flow::Stop })
    }

    /// Sleeps until the event is due; returns whether pacing is on.
    fn pace(&mut self, at: Option<u64>) -> bool {
        let Speed::Factor(factor) = self.options.speed else {
            return false;
        };
        let Some(at) = at else { return true };
        let factor = if factor.is_finite() && factor > 0.0 {
            factor
        } else {
            1.0
        };
        let (start, t0) = *self.pace.get_or_insert((Instant::now(), at));
        #[allow(clippy::cast_precision_loss)] // millisecond offsets far below 2^52
        let offset = Duration::from_secs_f64(at.saturating_sub(t0) as f64 / 1000.0 / factor);
        let due = start + offset;
        let now = Instant::now();
        if due > now {
            self.flush();
            std::thread::sleep(due - now);
        }
        true
    }
}

impl ReplayHandle {
    /// Waits until the recording was read to its end (or to a stop point), then until the
    /// reflector whose status is `status` has durably committed everything it was served.
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
