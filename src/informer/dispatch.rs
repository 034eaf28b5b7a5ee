//! The dispatcher: one task per handler, reading the log after the handler's cursor.
//!
//! Nothing is buffered in memory beyond one batch: a slow handler only falls behind in the log
//! (it costs disk, not RAM). A handler that errors or panics is reported and the others go on.
//!
//! What a task feeds is a [`Sink`]: a user's [`EventHandler`] gets decoded objects
//! ([`Decoding`]); the controller's own enqueueing gets keys and, only when it asks, the raw
//! JSON ([`Changes`]), so that a controller's queue costs no decode.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tracing::Instrument;

use super::decoded::{Decoded, Side};
use super::error::{HandlerProblem, InformerIssue};
use super::handler::{Event, EventHandler, HandlerOptions};
use crate::object::{ObjectKey, ResourceVersion};
use crate::reflector::ReflectorStatus;
use crate::store::{
    CursorName, DeltaKind, FeedRead, LogReader, LogRecord, ScopeId, Seq, Snapshot, Store, StoreError, StoredObject,
    Writer,
};

/// How many log entries one read takes.
const BATCH: usize = 256;

pub(crate) type Report = Arc<dyn Fn(InformerIssue) + Send + Sync>;

/// A handler's issue.
fn issue(label: &str, problem: HandlerProblem) -> InformerIssue {
    InformerIssue::Handler {
        handler: label.to_owned(),
        problem,
    }
}

/// A stored object (of a store scan, not the log) that does not decode for a handler.
fn undecodable(label: &str, o: &StoredObject, e: &serde_json::Error) -> InformerIssue {
    issue(
        label,
        HandlerProblem::Undecodable {
            key: o.key.clone(),
            seq: None,
            message: e.to_string(),
        },
    )
}

/// A store error met while serving a handler.
fn store_issue(label: &str, context: &'static str, e: StoreError) -> InformerIssue {
    issue(
        label,
        HandlerProblem::Store {
            context,
            error: Arc::new(e),
        },
    )
}

pub(crate) struct Ctx {
    pub(crate) store: Store,
    pub(crate) log: LogReader,
    pub(crate) writer: Writer,
    pub(crate) scope: ScopeId,
    pub(crate) status: watch::Receiver<ReflectorStatus>,
    /// The log position at which the informer became synced.
    pub(crate) sync_seq: watch::Receiver<Option<Seq>>,
    pub(crate) initial_list: watch::Receiver<InitialList>,
    pub(crate) report: Report,
}

/// Where this run's initial LIST lies in the log, so its adds reach handlers as
/// `Add { initial: true }` (client-go's `isInInitialList`).
#[derive(Debug, Clone, Default)]
pub(crate) struct InitialList {
    /// The committed seq when the informer started with a store that was not restored; `None`
    /// otherwise (no initial list in this run).
    pub(crate) after: Option<Seq>,
    /// The committed seq and RV at sync; `None` while the list runs.
    pub(crate) until: Option<(Seq, Option<ResourceVersion>)>,
}

impl InitialList {
    /// Whether the add at `seq` with `rv` came from the initial list: written after the start,
    /// not after the sync, and (the sync seq is read a moment after the fact) not newer than the
    /// list's RV, which watch events are.
    fn contains(&self, seq: Seq, rv: &ResourceVersion) -> bool {
        let Some(after) = self.after else { return false };
        if seq <= after {
            return false;
        }
        match &self.until {
            None => true,
            Some((until, list_rv)) => seq <= *until && !list_rv.as_ref().is_some_and(|l| l.is_older_than(rv)),
        }
    }
}

/// What one handler task delivers to.
pub(crate) trait Sink: Send + Sync + 'static {
    /// Whether the log records it reads must carry the objects' bytes; without them the log is
    /// read for kinds and keys only (nothing is decompressed).
    fn needs_bytes(&self) -> bool;

    /// Delivers one log record.
    fn record<'a>(&'a self, ctx: &'a Ctx, label: &'a str, rec: LogRecord) -> BoxFuture<'a, ()>;

    /// Delivers every object of `snapshot`, as synthetic adds or (`resync`) as resync updates;
    /// false when stopped or the store failed.
    fn snapshot<'a>(
        &'a self,
        ctx: &'a Ctx,
        label: &'a str,
        snapshot: Arc<Snapshot>,
        resync: bool,
        stop: &'a watch::Receiver<bool>,
    ) -> BoxFuture<'a, bool>;
}

/// A user's handler, given objects decoded once per log entry and shared with the informer's
/// other handlers of `K` (and its listers).
pub(crate) struct Decoding<K> {
    pub(crate) handler: Arc<dyn EventHandler<K>>,
    pub(crate) decoded: Arc<Decoded<K>>,
}

impl<K> Decoding<K>
where
    K: DeserializeOwned + Send + Sync + 'static,
{
    /// A stored object, as the handlers decoded it when it is their newest state of its key.
    fn decode_stored(&self, o: &StoredObject) -> Result<Arc<K>, serde_json::Error> {
        match self.decoded.latest(&o.key, &o.bytes) {
            Some(k) => Ok(k),
            None => serde_json::from_slice(&o.bytes).map(Arc::new),
        }
    }
}

impl<K> Sink for Decoding<K>
where
    K: DeserializeOwned + Send + Sync + 'static,
{
    fn needs_bytes(&self) -> bool {
        true
    }

    fn record<'a>(&'a self, ctx: &'a Ctx, label: &'a str, rec: LogRecord) -> BoxFuture<'a, ()> {
        Box::pin(deliver(ctx, self, label, rec))
    }

    fn snapshot<'a>(
        &'a self,
        ctx: &'a Ctx,
        label: &'a str,
        snapshot: Arc<Snapshot>,
        resync: bool,
        stop: &'a watch::Receiver<bool>,
    ) -> BoxFuture<'a, bool> {
        Box::pin(async move {
            let what = if resync {
                "resync could not read the store: "
            } else {
                ""
            };
            let read = |s: &Snapshot, after: Option<&ObjectKey>| s.list_after(after, BATCH);
            let mut pages = Pager::new(snapshot, read, stored_key);
            loop {
                let page = match pages.next(ctx, label, what, stop).await {
                    Ok(Some(page)) => page,
                    Ok(None) => return true,
                    Err(Stopped) => return false,
                };
                for o in page {
                    match self.decode_stored(&o) {
                        Ok(object) => {
                            let ev = if resync {
                                Event::Update {
                                    old: object.clone(),
                                    new: object,
                                    resync: true,
                                }
                            } else {
                                Event::Add { object, initial: true }
                            };
                            call(ctx, &*self.handler, label, ev).await;
                        }
                        Err(e) => (ctx.report)(undecodable(label, &o, &e)),
                    }
                }
            }
        })
    }
}

/// A snapshot read page by page on a blocking thread, all pages from its one consistent view.
struct Pager<T, R> {
    snapshot: Arc<Snapshot>,
    after: Option<ObjectKey>,
    read: R,
    key: fn(&T) -> &ObjectKey,
}

fn stored_key(o: &StoredObject) -> &ObjectKey {
    &o.key
}

fn state_key(s: &(ObjectKey, Option<bytes::Bytes>)) -> &ObjectKey {
    &s.0
}

/// Stopped, or the store failed (reported).
struct Stopped;

impl<T, R> Pager<T, R>
where
    T: Send + 'static,
    R: Fn(&Snapshot, Option<&ObjectKey>) -> Result<Vec<T>, StoreError> + Clone + Send + 'static,
{
    fn new(snapshot: Arc<Snapshot>, read: R, key: fn(&T) -> &ObjectKey) -> Self {
        Self {
            snapshot,
            after: None,
            read,
            key,
        }
    }

    /// The next page; `None` after the last.
    async fn next(
        &mut self,
        ctx: &Ctx,
        label: &str,
        what: &'static str,
        stop: &watch::Receiver<bool>,
    ) -> Result<Option<Vec<T>>, Stopped> {
        if *stop.borrow() {
            return Err(Stopped);
        }
        let (snap, from, read) = (self.snapshot.clone(), self.after.clone(), self.read.clone());
        match tokio::task::spawn_blocking(move || read(&snap, from.as_ref())).await {
            Ok(Ok(page)) => {
                self.after = page.last().map(|t| (self.key)(t).clone());
                Ok(Some(page).filter(|p| !p.is_empty()))
            }
            Ok(Err(e)) => {
                (ctx.report)(store_issue(label, what, e));
                Err(Stopped)
            }
            Err(_) => Err(Stopped),
        }
    }
}

/// What a [`Changes`] sink hears of: an object's key and, when the sink asked for bytes, its
/// states' JSON.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Change<'a> {
    pub(crate) key: &'a ObjectKey,
    /// The state before an update or a delete (a resync: the current state).
    pub(crate) old: Option<&'a [u8]>,
    /// The state after an add or an update (a resync: the current state).
    pub(crate) new: Option<&'a [u8]>,
}

/// Keys (and, with `bytes`, raw states) of every change, never decoded: the controller
/// enqueues from these. Undecided updates (no bytes to compare) count as changes.
pub(crate) struct Changes<F> {
    pub(crate) bytes: bool,
    pub(crate) on_change: F,
}

impl<F> Sink for Changes<F>
where
    F: Fn(Change<'_>) + Send + Sync + 'static,
{
    fn needs_bytes(&self) -> bool {
        self.bytes
    }

    fn record<'a>(&'a self, _ctx: &'a Ctx, _label: &'a str, rec: LogRecord) -> BoxFuture<'a, ()> {
        let (old, new) = match rec.kind {
            DeltaKind::Sync => return Box::pin(async {}),
            DeltaKind::Added | DeltaKind::Replaced => (None, rec.object.as_deref()),
            DeltaKind::Updated => {
                // Same bytes (same RV): nothing changed (as for decoded handlers).
                if self.bytes && rec.old.is_some() && rec.old == rec.object {
                    return Box::pin(async {});
                }
                (rec.old.as_deref(), rec.object.as_deref())
            }
            DeltaKind::Deleted => (rec.object.as_deref().or(rec.old.as_deref()), None),
        };
        (self.on_change)(Change {
            key: &rec.key,
            old,
            new,
        });
        Box::pin(async {})
    }

    fn snapshot<'a>(
        &'a self,
        ctx: &'a Ctx,
        label: &'a str,
        snapshot: Arc<Snapshot>,
        resync: bool,
        stop: &'a watch::Receiver<bool>,
    ) -> BoxFuture<'a, bool> {
        let bytes = self.bytes;
        Box::pin(async move {
            // Keys only, unless the sink wants the states.
            let read = move |s: &Snapshot, after: Option<&ObjectKey>| {
                if bytes {
                    s.list_after(after, BATCH)
                        .map(|p| p.into_iter().map(|o| (o.key, Some(o.bytes))).collect::<Vec<_>>())
                } else {
                    s.list_keys_after(after, KEY_BATCH)
                        .map(|p| p.into_iter().map(|k| (k, None)).collect())
                }
            };
            let mut pages = Pager::new(snapshot, read, state_key);
            loop {
                let page = match pages.next(ctx, label, "", stop).await {
                    Ok(Some(page)) => page,
                    Ok(None) => return true,
                    Err(Stopped) => return false,
                };
                for (key, state) in &page {
                    let state = state.as_deref();
                    (self.on_change)(Change {
                        key,
                        old: state.filter(|_| resync),
                        new: state,
                    });
                }
            }
        })
    }
}

enum Wake {
    Data,
    Resync,
    Stop,
}

/// How many keys one page of a keys-only snapshot takes (keys are small).
const KEY_BATCH: usize = 4096;

/// Runs one handler until `stop`.
pub(crate) async fn run<S: Sink>(
    ctx: Ctx,
    sink: S,
    opts: HandlerOptions,
    mut stop: watch::Receiver<bool>,
    synced: watch::Sender<bool>,
    position: watch::Sender<Seq>,
) {
    let label = opts
        .name
        .as_ref()
        .map_or_else(|| "volatile handler".to_owned(), ToString::to_string);
    let stored = match &opts.name {
        Some(name) => match ctx.log.cursor(ctx.scope, name.clone()) {
            Ok(c) => c,
            Err(e) => {
                (ctx.report)(store_issue(&label, "cannot read its cursor: ", e));
                return;
            }
        },
        None => None,
    };
    let mut cursor = match stored {
        Some(c) => c,
        None => match initial_adds(&ctx, &sink, &label, &stop).await {
            Some(c) => c,
            None => return,
        },
    };
    if let Some(name) = &opts.name {
        if stored.is_none() {
            persist(&ctx, name, cursor).await;
        }
    }
    position.send_replace(cursor);
    // A durable handler reads only what is on disk, so a crash never takes back an event it
    // acknowledged; a volatile one reads every commit.
    let durable = opts.name.is_some();
    let mut rollbacks = ctx.writer.rollbacks();
    let mut seen_rollbacks = rollbacks.borrow().0;
    let mut committed = if durable {
        ctx.writer.durable()
    } else {
        ctx.writer.committed()
    };
    // A volatile handler of a hot scope reads each change from the tier's feed as soon as the
    // writer has decided it, before its commit (the tier, so the lister, already has it), and
    // redb for what the feed no longer holds.
    let feed = if durable { None } else { ctx.store.hot().cloned() };
    let mut applied = ctx.writer.applied();
    let mut status = ctx.status.clone();
    let mut sync_seq = ctx.sync_seq.clone();
    let period = opts.resync.unwrap_or(Duration::MAX);
    let mut resync_at = tokio::time::Instant::now().checked_add(period);
    loop {
        if let Some(target) = *sync_seq.borrow() {
            if cursor >= target {
                synced.send_if_modified(|s| !std::mem::replace(s, true));
            }
        }
        let log = ctx.log.clone();
        let scope = ctx.scope;
        let head = *committed.borrow_and_update();
        let (n, at) = *rollbacks.borrow_and_update();
        if n != seen_rollbacks {
            // Commits that never reached the disk were rolled back after a failed fsync, or a
            // group told through the feed failed its commit; their seqs are handed out again
            // for what the reflector fetches anew: read them. (A
            // durable handler is never past the file's last seq.) `committed` alone cannot tell:
            // the log may show a commit a moment before its seq is published.
            seen_rollbacks = n;
            if at < cursor {
                cursor = at;
                position.send_replace(cursor);
            }
        }
        let bound = durable.then_some(head);
        applied.borrow_and_update();
        let from_feed = match feed.as_ref().map(|t| t.feed.after(cursor, BATCH)) {
            Some(FeedRead::Records { records, scanned }) => Some(Ok(Ok((records, scanned)))),
            Some(FeedRead::Behind) | None => None,
        };
        let read = match from_feed {
            Some(r) => r,
            None => {
                let bytes = sink.needs_bytes();
                tokio::task::spawn_blocking(move || log.read_scope_after_contiguous_with(cursor, BATCH, scope, bytes))
                    .await
            }
        };
        let (mut records, mut scanned) = match read {
            Ok(Ok(r)) => r,
            Ok(Err(e @ StoreError::LogCompacted { .. })) => {
                // Only possible without a durable cursor (compaction stops below those): what
                // was skipped is unknown, so start again from the current state, as after a
                // relist. Deletes inside the gap are not delivered.
                (ctx.report)(store_issue(&label, "", e));
                match initial_adds(&ctx, &sink, &label, &stop).await {
                    Some(c) => {
                        cursor = c;
                        position.send_replace(cursor);
                        if let Some(name) = &opts.name {
                            persist(&ctx, name, cursor).await;
                        }
                    }
                    None => return,
                }
                continue;
            }
            Ok(Err(e)) => {
                (ctx.report)(store_issue(&label, "reading the log: ", e));
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            Err(_) => return,
        };
        if let Some(bound) = bound {
            // Entries committed but not yet on disk wait for the durable commit.
            records.retain(|r| r.seq <= bound);
            scanned = scanned.min(bound).max(cursor);
        }
        if records.is_empty() {
            if scanned > cursor {
                cursor = scanned;
                position.send_replace(cursor);
                continue;
            }
            let resync_sleep = async {
                match resync_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => futures::future::pending().await,
                }
            };
            let woke = tokio::select! {
                _ = committed.changed() => Wake::Data,
                _ = applied.changed(), if feed.is_some() => Wake::Data,
                _ = status.changed() => Wake::Data,
                _ = sync_seq.changed() => Wake::Data,
                () = resync_sleep => Wake::Resync,
                _ = stop.wait_for(|s| *s) => Wake::Stop,
            };
            match woke {
                Wake::Data => {}
                Wake::Resync => {
                    resync(&ctx, &sink, &label, &stop).await;
                    resync_at = tokio::time::Instant::now().checked_add(period);
                }
                Wake::Stop => return,
            }
            continue;
        }
        for rec in records {
            if *stop.borrow() {
                return;
            }
            sink.record(&ctx, &label, rec)
                .instrument(tracing::trace_span!("dispatch"))
                .await;
        }
        cursor = scanned;
        if let Some(name) = &opts.name {
            persist(&ctx, name, cursor).await;
        }
        position.send_replace(cursor);
    }
}

/// Keeps the handler's `handler_lag_entries` gauge at "committed − cursor" as either moves, so
/// a handler stuck in a callback shows a growing lag rather than its last value. Runs until the
/// handler's task ends.
pub(crate) async fn track_lag(
    committed: watch::Receiver<Seq>,
    position: watch::Receiver<Seq>,
    done: watch::Receiver<bool>,
    labels: crate::metrics::HandlerLabels,
) {
    let gauge = crate::metrics::global().handler_lag.get_or_create(&labels).clone();
    let (mut committed, mut position, mut done) = (committed, position, done);
    loop {
        let lag = committed
            .borrow_and_update()
            .0
            .saturating_sub(position.borrow_and_update().0);
        gauge.set(i64::try_from(lag).unwrap_or(i64::MAX));
        tokio::select! {
            r = committed.changed() => if r.is_err() { return },
            r = position.changed() => if r.is_err() { return },
            _ = done.wait_for(|d| *d) => return,
        }
    }
}

async fn persist(ctx: &Ctx, name: &CursorName, cursor: Seq) {
    if let Err(e) = ctx.writer.set_cursor(ctx.scope, name.clone(), cursor).await {
        (ctx.report)(store_issue(&name.0, "cannot persist its cursor: ", e));
    }
}

/// Calls the handler, catching panics; returns whether it succeeded.
async fn call<K: Send + Sync + 'static>(ctx: &Ctx, handler: &dyn EventHandler<K>, label: &str, ev: Event<K>) -> bool {
    let fut = match std::panic::catch_unwind(AssertUnwindSafe(|| handler.handle(ev))) {
        Ok(f) => f,
        Err(p) => {
            (ctx.report)(issue(label, HandlerProblem::Panicked(crate::util::panic_message(&*p))));
            return false;
        }
    };
    match AssertUnwindSafe(fut).catch_unwind().await {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            (ctx.report)(issue(label, HandlerProblem::Failed(e)));
            false
        }
        Err(p) => {
            (ctx.report)(issue(label, HandlerProblem::Panicked(crate::util::panic_message(&*p))));
            false
        }
    }
}

/// One state of `rec`, decoded once for every handler of the informer. The new state of an
/// add or update is the object's current state: listers get it too, and so does the hot tier's
/// entry of that version when it holds these bytes, so that the update replacing it finds its
/// old state decoded (see `Feed::old`).
fn decode<K>(
    ctx: &Ctx,
    sink: &Decoding<K>,
    rec: &LogRecord,
    side: Side,
    bytes: &bytes::Bytes,
) -> Result<Arc<K>, crate::object::ObjectError>
where
    K: DeserializeOwned + Send + Sync + 'static,
{
    let current = side == Side::New && matches!(rec.kind, DeltaKind::Added | DeltaKind::Replaced | DeltaKind::Updated);
    let k = sink.decoded.get(rec.seq, side, bytes, current.then_some(&rec.key))?;
    if current {
        if let Some(view) = ctx.store.hot().and_then(|t| t.view()) {
            if let Some(e) = view.named(rec.key.namespace.as_deref(), &rec.key.name) {
                if e.bytes.as_ref() == Some(bytes) && e.typed::<K>().is_none() {
                    e.set_typed(&k);
                }
            }
        }
    }
    Ok(k)
}

async fn deliver<K>(ctx: &Ctx, sink: &Decoding<K>, label: &str, rec: LogRecord)
where
    K: DeserializeOwned + Send + Sync + 'static,
{
    let decode_or_report = |side: Side, bytes: &bytes::Bytes| match decode(ctx, sink, &rec, side, bytes) {
        Ok(k) => Some(k),
        Err(e) => {
            (ctx.report)(issue(
                label,
                HandlerProblem::Undecodable {
                    key: rec.key.clone(),
                    seq: Some(rec.seq),
                    message: e.to_string(),
                },
            ));
            None
        }
    };
    let ev = match rec.kind {
        DeltaKind::Added | DeltaKind::Replaced => {
            match rec.object.as_ref().and_then(|b| decode_or_report(Side::New, b)) {
                Some(object) => Event::Add {
                    object,
                    initial: ctx.initial_list.borrow().contains(rec.seq, &rec.rv),
                },
                None => return,
            }
        }
        DeltaKind::Updated => {
            let (Some(new_bytes), old_bytes) = (rec.object.as_ref(), rec.old.as_ref()) else {
                return;
            };
            // Same bytes (same RV): nothing changed for the handler.
            if old_bytes == Some(new_bytes) {
                return;
            }
            let Some(new) = decode_or_report(Side::New, new_bytes) else {
                return;
            };
            // The replaced version as the tier held it, decoded already by a reader (a handler,
            // a lister) of this type: no second decode per update.
            let replaced = || {
                let tier = ctx.store.hot()?;
                tier.feed.old(rec.seq)?.typed::<K>()
            };
            let old = match old_bytes.and_then(|b| replaced().or_else(|| decode_or_report(Side::Old, b))) {
                Some(o) => o,
                // The previous state left the retained log: old = new is the best we have.
                None => new.clone(),
            };
            Event::Update {
                old,
                new,
                resync: false,
            }
        }
        DeltaKind::Deleted => {
            let state = match (rec.object.as_ref(), rec.old.as_ref()) {
                (Some(b), _) => Some((Side::New, b)),
                (None, Some(b)) => Some((Side::Old, b)),
                (None, None) => None,
            };
            match state.and_then(|(side, b)| decode_or_report(side, b)) {
                Some(object) => Event::Delete {
                    object,
                    final_state_unknown: rec.final_state_unknown,
                },
                None => return,
            }
        }
        DeltaKind::Sync => return,
    };
    call(ctx, &*sink.handler, label, ev).await;
}

/// Synthetic adds of everything in the store, read from one consistent view in pages. Returns
/// the log position of that view, or `None` when stopped.
async fn initial_adds<S: Sink>(ctx: &Ctx, sink: &S, label: &str, stop: &watch::Receiver<bool>) -> Option<Seq> {
    let (snapshot, position) = match ctx.store.snapshot().and_then(|s| s.position().map(|p| (s, p))) {
        Ok(sp) => sp,
        Err(e) => {
            (ctx.report)(store_issue(label, "", e));
            return None;
        }
    };
    sink.snapshot(ctx, label, Arc::new(snapshot), false, stop)
        .await
        .then_some(position)
}

/// A resync: `Update { old = new }` for every object, read from one consistent view in pages
/// (like [`initial_adds`]: a large store is never loaded at once). Stops early on `stop`.
async fn resync<S: Sink>(ctx: &Ctx, sink: &S, label: &str, stop: &watch::Receiver<bool>) {
    match ctx.store.snapshot() {
        Ok(s) => {
            sink.snapshot(ctx, label, Arc::new(s), true, stop).await;
        }
        Err(e) => (ctx.report)(store_issue(label, "resync could not read the store: ", e)),
    }
}
