//! Handler tasks, one per handler: a volatile handler is told from the informer's cache (its
//! pending keys, see [`cache`](super::cache)), a durable one reads the log after its persisted
//! cursor, up to what is on disk.
//!
//! Nothing is buffered beyond what a handler has yet to hear of: a slow volatile handler holds
//! at most one pending key per object (and sees each object's newest state), a slow durable
//! handler falls behind in the log (it costs disk, not RAM). A handler that errors or panics is
//! reported and the others go on.

use std::collections::{HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tracing::Instrument;

use super::cache::{Cache, Dirty, Entry, Listener, Next};
use super::error::{HandlerProblem, InformerIssue};
use super::handler::{Event, EventHandler, HandlerOptions};
use crate::object::{ObjectKey, ObjectMeta, ResourceVersion};
use crate::store::{
    CursorName, DamagedEntry, DeltaKind, LogEntry, LogReader, LogRecord, ObjectEntry, ScopeId, Seq, Snapshot, Store,
    StoreError, Writer,
};

/// How many log entries one read takes.
const BATCH: usize = 256;

/// The first and longest wait before a handler retries after a store error.
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// The wait before telling a key whose version to tell left the store: the cache applies the
/// newer one meanwhile.
const RETRY_COLD: Duration = Duration::from_millis(20);

pub(crate) type Report = Arc<dyn Fn(InformerIssue) + Send + Sync>;

/// A handler's issue.
fn issue(label: &str, problem: HandlerProblem) -> InformerIssue {
    InformerIssue::Handler {
        handler: label.to_owned(),
        problem,
    }
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

/// What every handler task of an informer shares.
pub(crate) struct Ctx {
    pub(crate) store: Store,
    pub(crate) log: LogReader,
    pub(crate) writer: Writer,
    pub(crate) scope: ScopeId,
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

/// What a handler task reports back to its [`Registration`](super::Registration).
pub(crate) struct Progress {
    pub(crate) synced: watch::Sender<bool>,
    pub(crate) position: watch::Sender<Seq>,
    /// Set once the handler's position in the log is fixed (its cursor read, or the view its
    /// initial adds are told from taken and pinned): everything written after it reaches the
    /// handler one by one.
    pub(crate) placed: watch::Sender<bool>,
}

/// Calls the handler, catching panics; returns whether it succeeded.
async fn call<K: Send + Sync + 'static>(
    report: &Report,
    handler: &dyn EventHandler<K>,
    label: &str,
    ev: Event<K>,
) -> bool {
    let fut = match std::panic::catch_unwind(AssertUnwindSafe(|| handler.handle(ev))) {
        Ok(f) => f,
        Err(p) => {
            report(issue(label, HandlerProblem::Panicked(crate::util::panic_message(&*p))));
            return false;
        }
    };
    match AssertUnwindSafe(fut)
        .catch_unwind()
        .instrument(tracing::trace_span!("handler"))
        .await
    {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            report(issue(label, HandlerProblem::Failed(e)));
            false
        }
        Err(p) => {
            report(issue(label, HandlerProblem::Panicked(crate::util::panic_message(&*p))));
            false
        }
    }
}

/// Waits for `stop`; returns once it is true or its sender is gone (the informer was dropped).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

fn undecodable(label: &str, key: &ObjectKey, seq: Option<Seq>, message: &str) -> InformerIssue {
    issue(
        label,
        HandlerProblem::Undecodable {
            key: key.clone(),
            seq,
            message: message.to_owned(),
        },
    )
}

// ---------------------------------------------------------------------------------------------
// volatile handlers

/// Runs one volatile handler until `stop`: tells it of each key pending for it, as the cache
/// holds it, in the order the keys became pending.
pub(crate) async fn run_volatile<K>(
    ctx: Ctx,
    cache: Arc<Cache<K>>,
    handler: Arc<dyn EventHandler<K>>,
    opts: HandlerOptions,
    mut stop: watch::Receiver<bool>,
    progress: Progress,
) where
    K: DeserializeOwned + Send + Sync + 'static,
{
    let label = "volatile handler".to_owned();
    let listener = cache.listen(opts.queued.unwrap_or(super::cache::EXACT_LIMIT));
    // Its initial adds read every object: what the cache holds without JSON is read in pages.
    tokio::spawn(Cache::fill_for_listeners(Arc::downgrade(&cache)));
    let period = opts.resync.unwrap_or(Duration::MAX);
    let mut resync_at = tokio::time::Instant::now().checked_add(period);
    let mut wake = cache.waker();
    let mut applied = cache.applied();
    let mut folds = 0;
    loop {
        if *stop.borrow() {
            break;
        }
        let (n, limit) = listener.folds();
        if n > folds {
            folds = n;
            (ctx.report)(issue(&label, HandlerProblem::FellBehind { limit }));
        }
        if let Some(w) = wake.as_mut() {
            w.borrow_and_update();
        }
        // Whoever wakes first applies what the writer published: this task too, so a handler
        // hears of a change one wake-up after the writer decided it.
        cache.pump_now();
        if listener.synced() {
            progress.synced.send_if_modified(|s| !std::mem::replace(s, true));
        }
        let position = match listener.first_since() {
            Some(since) => Seq(since.0.saturating_sub(1)),
            None => applied.borrow_and_update().1,
        };
        progress
            .position
            .send_if_modified(|p| std::mem::replace(p, position) != position);
        if let Some(mut next) = cache.next(&listener) {
            warm_told(&cache, &mut next).await;
            tell(&ctx, &cache, &listener, &*handler, &label, next).await;
            continue;
        }
        let resync_sleep = async {
            match resync_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => futures::future::pending().await,
            }
        };
        let stream = async {
            match wake.as_mut() {
                Some(w) => w.changed().await.is_ok(),
                None => futures::future::pending().await,
            }
        };
        tokio::select! {
            ok = stream => if !ok {
                // The stream was replaced (the cache reloaded): follow the new one.
                wake = None;
            },
            () = listener.notify.notified() => {}
            _ = applied.changed() => {}
            () = stopped(&mut stop) => break,
            () = resync_sleep => {
                cache.resync(&listener);
                resync_at = tokio::time::Instant::now().checked_add(period);
            }
        }
        if wake.is_none() {
            wake = cache.waker();
        }
    }
    cache.unlisten(&listener);
}

/// An update's previous state that the cache holds no JSON of (replaced since it was loaded
/// or evicted) is read back and decoded on a blocking thread while this task decodes the new
/// state, instead of one after the other.
async fn warm_told<K>(cache: &Arc<Cache<K>>, next: &mut Next<K>)
where
    K: DeserializeOwned + Send + Sync + 'static,
{
    let Some(told) = next.dirty.told.as_ref().filter(|t| !t.has_json()) else {
        return;
    };
    if next.after.as_ref().is_some_and(|a| a.same_version(told)) {
        // Unchanged (a resync): read once, into the cache, by the handler.
        return;
    }
    let back = cache.told_back(told, next.dirty.since);
    if let Some(after) = &next.after {
        let _ = after.object();
    }
    if let Ok(Some(warm)) = back.await {
        next.dirty.told = Some(warm);
    }
}

/// The decoded object of `entry` (read back from redb if cold). `Ok(None)`: no longer to be
/// found anywhere.
async fn object<K>(
    cache: &Arc<Cache<K>>,
    entry: &Arc<Entry<K>>,
    hint: Option<Seq>,
) -> Result<Option<Arc<K>>, StoreError>
where
    K: DeserializeOwned + Send + Sync + 'static,
{
    cache.resolve(entry, hint).await
}

/// An object of `K` made of `meta` alone: a delete's object when no state of it can be read any
/// more (every Kubernetes type decodes from its metadata, its other fields being optional).
fn from_meta<K: DeserializeOwned>(meta: &ObjectMeta) -> Option<Arc<K>> {
    let json = serde_json::json!({"metadata": {
        "name": meta.name,
        "namespace": meta.namespace,
        "uid": meta.uid,
        "resourceVersion": meta.resource_version.as_str(),
        "labels": meta.labels,
        "annotations": meta.annotations,
    }});
    serde_json::from_value(json).ok().map(Arc::new)
}

/// Tells the handler what changed about one key: from what it was told to the cache's state.
async fn tell<K>(
    ctx: &Ctx,
    cache: &Arc<Cache<K>>,
    l: &Listener<K>,
    handler: &dyn EventHandler<K>,
    label: &str,
    next: Next<K>,
) where
    K: DeserializeOwned + Send + Sync + 'static,
{
    let Next { dirty, after, folded } = next;
    let key = dirty.key.clone();
    let report = &ctx.report;
    // The state to tell, decoded. A cold one that cannot be read back any more has changed
    // since, and one that cannot be read now (the writer reopening the file after an I/O
    // error): the key is put back, and told from the cache's state once it reads.
    let now = match &after {
        None => None,
        Some(c) => match object(cache, c, None).await {
            Ok(Some(k)) => Some((c.clone(), k)),
            Ok(None) => {
                // Told from the cache's state (a newer one) instead.
                l.put_back(dirty);
                tokio::time::sleep(RETRY_COLD).await;
                return;
            }
            Err(e) if transient(&e) => {
                report(store_issue(label, "reading an object to tell (retried): ", e));
                let mut dirty = dirty;
                dirty.after = (!folded).then(|| after.clone());
                return retry_later(l, dirty, RETRY_FIRST).await;
            }
            Err(e) => {
                // Its JSON does not decode as K: reported, and the change counts as told.
                report(undecodable(label, &key, Some(c.seq), &e.to_string()));
                return;
            }
        },
    };
    let told = match &dirty.told {
        None => None,
        Some(t) => match object(cache, t, Some(dirty.since)).await {
            Ok(Some(k)) => Some((t.clone(), Some(k))),
            Ok(None) => Some((t.clone(), None)),
            Err(e) if transient(&e) => {
                report(store_issue(label, "reading an object to tell (retried): ", e));
                let mut dirty = dirty;
                dirty.after = (!folded).then(|| after.clone());
                return retry_later(l, dirty, RETRY_FIRST).await;
            }
            Err(e) => {
                report(undecodable(label, &key, None, &e.to_string()));
                Some((t.clone(), None))
            }
        },
    };
    let initial = |e: &Entry<K>| {
        dirty.initial
            || ctx
                .initial_list
                .borrow()
                .contains(dirty.since, &e.meta.resource_version)
    };
    match (told, now) {
        (None, None) => {}
        (None, Some((c, object))) => {
            let initial = initial(&c);
            call(report, handler, label, Event::Add { object, initial }).await;
        }
        (Some((t, old)), None) => {
            delete(cache, report, handler, label, &key, &dirty, &t, old).await;
        }
        (Some((t, old)), Some((c, new))) if !t.same_object(&c) => {
            // Deleted and created again under its name while the handler was behind.
            delete(cache, report, handler, label, &key, &dirty, &t, old).await;
            call(
                report,
                handler,
                label,
                Event::Add {
                    object: new,
                    initial: false,
                },
            )
            .await;
        }
        (Some((t, _)), Some((c, new))) if t.same_version(&c) => {
            if dirty.resync {
                let ev = Event::Update {
                    old: new.clone(),
                    new,
                    resync: true,
                };
                call(report, handler, label, ev).await;
            }
        }
        (Some((_, old)), Some((_, new))) => {
            // The state told left the retained log: old = new is the best there is.
            let old = old.unwrap_or_else(|| new.clone());
            let ev = Event::Update {
                old,
                new,
                resync: false,
            };
            call(report, handler, label, ev).await;
        }
    }
}

/// Puts `dirty` back, first in line, to be told again after `wait`.
async fn retry_later<K>(l: &Listener<K>, dirty: Dirty<K>, wait: Duration) {
    l.retry(dirty);
    tokio::time::sleep(wait).await;
}

/// Whether a read failed for a while only (the file reopening after an I/O error, a full
/// disk), not for what it read: retried rather than reported as an undecodable object.
fn transient(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::Closed { .. }
            | StoreError::Storage { .. }
            | StoreError::Io { .. }
            | StoreError::WriterGone
            | StoreError::Locked { .. }
    )
}

/// Tells the handler `key` is gone: with the final state the server sent, else the last state
/// it was told.
#[allow(clippy::too_many_arguments)] // one caller, two call sites
async fn delete<K>(
    cache: &Arc<Cache<K>>,
    report: &Report,
    handler: &dyn EventHandler<K>,
    label: &str,
    key: &ObjectKey,
    dirty: &Dirty<K>,
    told: &Arc<Entry<K>>,
    told_object: Option<Arc<K>>,
) where
    K: DeserializeOwned + Send + Sync + 'static,
{
    let final_state = match &dirty.deleted {
        Some(d) => object(cache, d, None).await.ok().flatten(),
        None => None,
    };
    let final_state_unknown = final_state.is_none();
    let object = final_state.or(told_object).or_else(|| from_meta::<K>(&told.meta));
    match object {
        Some(object) => {
            let ev = Event::Delete {
                object,
                final_state_unknown,
            };
            call(report, handler, label, ev).await;
        }
        None => report(undecodable(
            label,
            key,
            None,
            "no state of the deleted object can be read",
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// durable handlers

/// Decoded objects of log records and stored objects, shared with the cache when it holds
/// the same version.
struct Decode<K> {
    cache: Option<Arc<Cache<K>>>,
}

impl<K: DeserializeOwned + Send + Sync + 'static> Decode<K> {
    /// `bytes` of `key` at `rv`, decoded (the cache's object when it holds these bytes).
    fn decode(&self, key: &ObjectKey, rv: &ResourceVersion, bytes: &bytes::Bytes) -> Result<Arc<K>, serde_json::Error> {
        if let Some(Some(e)) = self.cache.as_ref().and_then(|c| c.entry(key)) {
            if e.meta.resource_version == *rv && e.json().is_some_and(|j| j.is(bytes)) {
                if let Some(Ok(k)) = e.object() {
                    return Ok(k);
                }
            }
        }
        serde_json::from_slice(bytes).map(Arc::new)
    }
}

/// Runs one durable handler until `stop`: its persisted cursor (or, the first time, synthetic
/// adds of what is on disk), then every log entry of the scope after it, up to what is on disk.
#[allow(clippy::too_many_lines)] // one loop with its retries
pub(crate) async fn run_durable<K>(
    ctx: Ctx,
    cache: Option<Arc<Cache<K>>>,
    handler: Arc<dyn EventHandler<K>>,
    name: CursorName,
    opts: HandlerOptions,
    mut stop: watch::Receiver<bool>,
    progress: Progress,
) where
    K: DeserializeOwned + Send + Sync + 'static,
{
    let label = name.to_string();
    let decode = Decode { cache };
    let mut retry = RETRY_FIRST;
    // A store that does not fsync reports each commit on disk at once, and a reopen after an
    // I/O error takes back what the file lacks: what the handler is told is kept, so that such
    // a rollback is told to it (`rewind`).
    let mut told = (!ctx.writer.fsyncs()).then(Told::default);
    let mut rollbacks = ctx.writer.rollbacks();
    let mut seen = rollbacks.borrow_and_update().0;
    let mut rewind_to: Option<Seq> = None;
    // Synthetic adds of a view on disk, at the first start and after a cursor fell off the log.
    macro_rules! first_view {
        () => {
            initial_adds(
                &ctx,
                &decode,
                &*handler,
                &label,
                &name,
                &stop,
                &progress.placed,
                told.as_mut().map(|t| (t, seen)),
            )
            .await
        };
    }
    // Its cursor, or its first view: retried through store errors (a reopen after an I/O
    // error), never given up while not stopped.
    let mut cursor = loop {
        let log = ctx.log.clone();
        let (scope, n) = (ctx.scope, name.clone());
        match tokio::task::spawn_blocking(move || log.cursor(scope, n)).await {
            Ok(Ok(Some(c))) => {
                progress.placed.send_replace(true);
                remove_leftover_marker(&ctx, &label, &name).await;
                break c;
            }
            Ok(Ok(None)) => match first_view!() {
                Ok(Some(c)) => break c,
                Ok(None) => return,
                Err(e) => (ctx.report)(store_issue(&label, "its initial adds: ", e)),
            },
            Ok(Err(e)) => (ctx.report)(store_issue(&label, "cannot read its cursor: ", e)),
            Err(_) => return,
        }
        tokio::select! {
            () = tokio::time::sleep(retry) => {}
            () = stopped(&mut stop) => return,
        }
        retry = (retry * 2).min(RETRY_MAX);
    };
    progress.position.send_replace(cursor);
    let mut durable = ctx.writer.durable();
    let mut sync_seq = ctx.sync_seq.clone();
    let period = opts.resync.unwrap_or(Duration::MAX);
    let mut resync_at = tokio::time::Instant::now().checked_add(period);
    retry = RETRY_FIRST;
    loop {
        // A rollback is told before the handler stops: its persisted cursor may be of the
        // history taken back, and what it was told of that history is known only here.
        if let Some(t) = told.as_mut() {
            let (n, at) = *rollbacks.borrow_and_update();
            if n != seen {
                // Two rollbacks since the last look: the first one's seq is not known, so
                // everything told is looked at again.
                let to = if n == seen + 1 { at } else { Seq(0) };
                seen = n;
                rewind_to = Some(rewind_to.map_or(to, |r| r.min(to)));
            }
            if let Some(to) = rewind_to {
                match rewind(&ctx, &decode, &*handler, &label, t, to, &stop).await {
                    Ok(Some(position)) => {
                        rewind_to = None;
                        retry = RETRY_FIRST;
                        if position != cursor {
                            cursor = position;
                            persist(&ctx, &name, cursor, Some(seen)).await;
                            progress.position.send_replace(cursor);
                        }
                    }
                    Ok(None) => return,
                    Err(e) => {
                        (ctx.report)(store_issue(&label, "telling it of a rollback: ", e));
                        if *stop.borrow() {
                            return;
                        }
                        tokio::select! {
                            () = tokio::time::sleep(retry) => {}
                            () = stopped(&mut stop) => return,
                        }
                        retry = (retry * 2).min(RETRY_MAX);
                    }
                }
                continue;
            }
        }
        if *stop.borrow() {
            return;
        }
        // (only a store that does not fsync has rollbacks of what the handler was told)
        let epoch = told.is_some().then_some(seen);
        if let Some(target) = *sync_seq.borrow() {
            if cursor >= target {
                progress.synced.send_if_modified(|s| !std::mem::replace(s, true));
            }
        }
        let bound = *durable.borrow_and_update();
        let (log, scope) = (ctx.log.clone(), ctx.scope);
        let read =
            tokio::task::spawn_blocking(move || log.read_scope_entries_after_contiguous(cursor, BATCH, scope)).await;
        let (mut records, mut scanned) = match read {
            Ok(Ok(r)) => r,
            Ok(Err(e @ StoreError::LogCompacted { .. })) => {
                // Compaction stops below durable cursors, and below a new handler's pin: only
                // a cursor set by hand gets here. What was skipped is unknown: start again from
                // the current state, as after a relist (deletes in the gap are not delivered).
                (ctx.report)(store_issue(&label, "", e));
                match first_view!() {
                    Ok(Some(c)) => {
                        cursor = c;
                        progress.position.send_replace(cursor);
                    }
                    Ok(None) => return,
                    Err(e) => (ctx.report)(store_issue(&label, "its initial adds: ", e)),
                }
                continue;
            }
            Ok(Err(e)) => {
                (ctx.report)(store_issue(&label, "reading the log: ", e));
                tokio::select! {
                    () = tokio::time::sleep(retry) => {}
                    () = stopped(&mut stop) => return,
                }
                retry = (retry * 2).min(RETRY_MAX);
                continue;
            }
            Err(_) => return,
        };
        retry = RETRY_FIRST;
        // Entries committed but not yet on disk wait for the durable commit.
        records.retain(|r| r.seq() <= bound);
        scanned = scanned.min(bound).max(cursor);
        if records.is_empty() {
            if scanned > cursor {
                cursor = scanned;
                progress.position.send_replace(cursor);
                continue;
            }
            let resync_sleep = async {
                match resync_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => futures::future::pending().await,
                }
            };
            tokio::select! {
                changed = durable.changed() => if changed.is_err() {
                    // The writer is gone: nothing more will be on disk.
                    return;
                },
                Ok(()) = rollbacks.changed(), if told.is_some() => {}
                changed = sync_seq.changed() => if changed.is_err() {
                    // The informer is gone.
                    return;
                },
                () = resync_sleep => {
                    resync(&ctx, &decode, &*handler, &label, &stop).await;
                    resync_at = tokio::time::Instant::now().checked_add(period);
                }
                () = stopped(&mut stop) => return,
            }
            continue;
        }
        // Stopped mid-batch, the cursor keeps what was delivered (a restart tells it again
        // otherwise), but not an entry whose call failed as the handler was being removed
        // (the controller's delete hook, cut short by a shutdown): that one is told again.
        let mut delivered = cursor;
        for entry in records {
            if *stop.borrow() {
                break;
            }
            let seq = entry.seq();
            if let Some(t) = told.as_mut() {
                t.note_entry(&entry);
            }
            let handled = match entry {
                LogEntry::Record(rec) => deliver(&ctx, &decode, &*handler, &label, rec).await,
                LogEntry::Damaged(d) => {
                    damaged(&ctx, &decode, &*handler, &label, d, &stop).await;
                    true
                }
            };
            if !handled && *stop.borrow() {
                break;
            }
            delivered = seq;
        }
        if *stop.borrow() {
            if delivered > cursor {
                cursor = delivered;
                persist(&ctx, &name, cursor, epoch).await;
                progress.position.send_replace(cursor);
            }
            // (the loop's top tells a rollback that came meanwhile, then returns)
            continue;
        }
        cursor = scanned;
        persist(&ctx, &name, cursor, epoch).await;
        progress.position.send_replace(cursor);
    }
}

/// Removes the marker of initial adds whose cursor was persisted but whose marker could not
/// be removed (it would hold compaction back for good).
async fn remove_leftover_marker(ctx: &Ctx, label: &str, name: &CursorName) {
    let (log, scope, marker) = (ctx.log.clone(), ctx.scope, pending_marker(name));
    let m = marker.clone();
    if let Ok(Ok(Some(_))) = tokio::task::spawn_blocking(move || log.cursor(scope, m)).await {
        if let Err(e) = ctx.writer.delete_cursor(ctx.scope, marker).await {
            (ctx.report)(store_issue(label, "cannot remove its initial adds' marker: ", e));
        }
    }
}

async fn persist(ctx: &Ctx, name: &CursorName, cursor: Seq, seen: Option<u64>) {
    if let Err(e) = save_cursor(ctx, name, cursor, seen).await {
        (ctx.report)(store_issue(&name.0, "cannot persist its cursor: ", e));
    }
}

/// Persists a durable handler's cursor. With `seen` (a store that does not fsync: its
/// rollbacks take back what the handler was told), only if no rollback came since the handler
/// last looked; otherwise nothing is saved, and the handler tells the rollback next and saves
/// the cursor after it.
async fn save_cursor(ctx: &Ctx, name: &CursorName, cursor: Seq, seen: Option<u64>) -> Result<(), StoreError> {
    let saved = match seen {
        Some(n) => {
            ctx.writer
                .set_cursor_unless_rolled_back(ctx.scope, name.clone(), cursor, n)
                .await
        }
        None => ctx.writer.set_cursor(ctx.scope, name.clone(), cursor).await,
    };
    match saved {
        Err(StoreError::CursorRolledBack { .. }) => Ok(()),
        saved => saved,
    }
}

/// One log record, decoded, to a durable handler. False when the handler's call failed (a
/// record it is not told of counts as handled).
async fn deliver<K>(ctx: &Ctx, decode: &Decode<K>, handler: &dyn EventHandler<K>, label: &str, rec: LogRecord) -> bool
where
    K: DeserializeOwned + Send + Sync + 'static,
{
    let decode_or_report = |bytes: &bytes::Bytes, rv: &ResourceVersion| match decode.decode(&rec.key, rv, bytes) {
        Ok(k) => Some(k),
        Err(e) => {
            (ctx.report)(undecodable(label, &rec.key, Some(rec.seq), &e.to_string()));
            None
        }
    };
    let unknown_rv = ResourceVersion::default();
    let ev = match rec.kind {
        DeltaKind::Added | DeltaKind::Replaced => {
            match rec.object.as_ref().and_then(|b| decode_or_report(b, &rec.rv)) {
                Some(object) => Event::Add {
                    object,
                    initial: ctx.initial_list.borrow().contains(rec.seq, &rec.rv),
                },
                None => return true,
            }
        }
        DeltaKind::Updated => {
            let (Some(new_bytes), old_bytes) = (rec.object.as_ref(), rec.old.as_ref()) else {
                return true;
            };
            // Same bytes (same RV): nothing changed for the handler.
            if old_bytes == Some(new_bytes) {
                return true;
            }
            let Some(new) = decode_or_report(new_bytes, &rec.rv) else {
                return true;
            };
            // The previous state left the retained log: old = new is the best there is.
            let old = old_bytes
                .and_then(|b| decode_or_report(b, &unknown_rv))
                .unwrap_or_else(|| new.clone());
            Event::Update {
                old,
                new,
                resync: false,
            }
        }
        DeltaKind::Deleted => {
            let state = rec.object.as_ref().or(rec.old.as_ref());
            match state.and_then(|b| decode_or_report(b, &unknown_rv)) {
                Some(object) => Event::Delete {
                    object,
                    final_state_unknown: rec.final_state_unknown,
                },
                None => return true,
            }
        }
        DeltaKind::Sync => return true,
    };
    call(&ctx.report, handler, label, ev).await
}

/// A damaged log entry: reported and skipped, so the cursor moves on. What the handler may
/// have missed is told again, as client-go answers missing state with a resync: the entry's
/// previous state alone unreadable, the entry itself with `old` = `new`; its key known, that
/// object's current state as a resync update (a delete when it is gone); nothing known, every
/// stored object as resync updates. A delete the entry held for an object the handler knew
/// is then told only when the key is known.
async fn damaged<K>(
    ctx: &Ctx,
    decode: &Decode<K>,
    handler: &dyn EventHandler<K>,
    label: &str,
    d: DamagedEntry,
    stop: &watch::Receiver<bool>,
) where
    K: DeserializeOwned + Send + Sync + 'static,
{
    let recovery = match (&d.partial, &d.key) {
        (Some(_), _) => "delivered without its previous state",
        (None, Some(_)) => "the object's current state is delivered as a resync",
        (None, None) => "every stored object is delivered as a resync; a delete it held is lost",
    };
    (ctx.report)(issue(
        label,
        HandlerProblem::DamagedLogEntry {
            seq: d.seq,
            key: d.key.clone(),
            message: d.error.to_string(),
            recovery,
        },
    ));
    if let Some(rec) = d.partial {
        deliver(ctx, decode, handler, label, rec).await;
        return;
    }
    let snapshot = match durable_snapshot(ctx).await {
        Ok((snapshot, _)) => Arc::new(snapshot),
        Err(e) => {
            (ctx.report)(store_issue(label, "reading the store after a damaged log entry: ", e));
            return;
        }
    };
    let Some(key) = d.key else {
        if let Err(e) = snapshot_events(ctx, decode, handler, label, snapshot, true, stop, None).await {
            (ctx.report)(store_issue(label, "resync could not read the store: ", e));
        }
        return;
    };
    let k = key.clone();
    let current = tokio::task::spawn_blocking(move || snapshot.get(&k)).await;
    let ev = match current {
        Ok(Ok(Some(o))) => match decode.decode(&o.key, &o.meta.resource_version, &o.bytes) {
            Ok(object) => Event::Update {
                old: object.clone(),
                new: object,
                resync: true,
            },
            Err(e) => return (ctx.report)(undecodable(label, &key, None, &e.to_string())),
        },
        Ok(Ok(None)) => match from_meta::<K>(&key_meta(&key)) {
            Some(object) => Event::Delete {
                object,
                final_state_unknown: true,
            },
            None => return,
        },
        Ok(Err(e)) => return (ctx.report)(store_issue(label, "reading the object of a damaged log entry: ", e)),
        Err(_) => return,
    };
    call(&ctx.report, handler, label, ev).await;
}

/// A view of the store at or below what is on disk, and its position: durable handlers are
/// never told of what a crash could take back, their initial adds included.
async fn durable_snapshot(ctx: &Ctx) -> Result<(Snapshot, Seq), StoreError> {
    loop {
        let rollbacks = ctx.writer.rollbacks().borrow().0;
        let store = ctx.store.clone();
        let (snapshot, position) = tokio::task::spawn_blocking(move || {
            let s = store.snapshot()?;
            let p = s.position()?;
            Ok::<_, StoreError>((s, p))
        })
        .await
        .map_err(|e| StoreError::Aborted(format!("reading the store: {e}")))??;
        if *ctx.writer.durable().borrow() < position {
            // Commits waiting for their fsync: make them durable now.
            ctx.writer.flush().await?;
        }
        // A rollback since the view was taken may have lost what it holds: take another.
        if ctx.writer.rollbacks().borrow().0 == rollbacks && *ctx.writer.durable().borrow() >= position {
            return Ok((snapshot, position));
        }
    }
}

/// The most keys a durable handler's [`Told`] keeps, and the most JSON it keeps of them.
const TOLD_KEYS: usize = 1 << 16;
const TOLD_JSON_BYTES: usize = 16 << 20;

/// What a durable handler was last told of each key, kept only on a store that does not fsync
/// ([`Writer::fsyncs`]): there a reopen after an I/O error takes back commits the handler was
/// told of, and [`rewind`] tells it the difference, as volatile handlers are told a rollback.
#[derive(Default)]
struct Told {
    keys: HashMap<ObjectKey, (Seq, Said)>,
    json_bytes: usize,
    /// More keys were told than are kept: a rollback can no longer be told key by key.
    overflowed: bool,
}

/// The state a handler was told of a key.
#[derive(Clone)]
enum Said {
    /// Present, with its JSON when kept.
    Present(Option<bytes::Bytes>),
    Absent,
    /// A damaged log entry was reported for it.
    Unknown,
}

impl Told {
    fn note(&mut self, seq: Seq, key: &ObjectKey, said: Said) {
        if self.overflowed {
            return;
        }
        let said = match said {
            Said::Present(Some(b)) if self.json_bytes + b.len() > TOLD_JSON_BYTES => Said::Present(None),
            said => said,
        };
        if let Said::Present(Some(b)) = &said {
            self.json_bytes += b.len();
        }
        if let Some((_, Said::Present(Some(old)))) = self.keys.insert(key.clone(), (seq, said)) {
            self.json_bytes -= old.len();
        }
        if self.keys.len() > TOLD_KEYS {
            self.keys = HashMap::new();
            self.json_bytes = 0;
            self.overflowed = true;
        }
    }

    fn note_entry(&mut self, entry: &LogEntry) {
        match entry {
            LogEntry::Record(r) => match r.kind {
                DeltaKind::Sync => {}
                DeltaKind::Deleted => self.note(r.seq, &r.key, Said::Absent),
                DeltaKind::Added | DeltaKind::Replaced | DeltaKind::Updated => {
                    self.note(r.seq, &r.key, Said::Present(r.object.clone()));
                }
            },
            LogEntry::Damaged(d) => {
                if let Some(key) = &d.key {
                    self.note(d.seq, key, Said::Unknown);
                }
            }
        }
    }

    /// The keys told after `to`.
    fn after(&self, to: Seq) -> Vec<(ObjectKey, Said)> {
        let mut keys: Vec<_> = self
            .keys
            .iter()
            .filter(|(_, (seq, _))| *seq > to)
            .map(|(k, (_, said))| (k.clone(), said.clone()))
            .collect();
        keys.sort_by(|a, b| a.0.cmp(&b.0));
        keys
    }

    /// A rollback was told: the keys are tracked again from here.
    fn settled(&mut self) {
        self.overflowed = false;
    }
}

/// After a rollback to `to` took back commits the handler may have been told of (a store that
/// does not fsync, reopened after an I/O error): each key told since is told its state in a
/// view now (an update back, a delete of what was only added, an add back of what was only
/// deleted), then the log after `to` up to that view, but for those keys. Returns the view's
/// position, the handler's new cursor (`None` when stopped).
#[allow(clippy::too_many_arguments)] // one caller
async fn rewind<K>(
    ctx: &Ctx,
    decode: &Decode<K>,
    handler: &dyn EventHandler<K>,
    label: &str,
    told: &mut Told,
    to: Seq,
    stop: &watch::Receiver<bool>,
) -> Result<Option<Seq>, StoreError>
where
    K: DeserializeOwned + Send + Sync + 'static,
{
    let (snapshot, position) = durable_snapshot(ctx).await?;
    let snapshot = Arc::new(snapshot);
    if told.overflowed {
        (ctx.report)(issue(label, HandlerProblem::RollbackNotTracked { to, kept: TOLD_KEYS }));
        // Tracked again from this round on, which tells every stored object.
        told.settled();
        if !snapshot_events(
            ctx,
            decode,
            handler,
            label,
            snapshot.clone(),
            false,
            stop,
            Some((told, position)),
        )
        .await?
        {
            return Ok(None);
        }
    }
    let mut restored = HashSet::new();
    // Not cut short by `stop`: a handler stopping tells the rollback first (bounded by what
    // `told` keeps and the log up to the view).
    for (key, said) in told.after(to) {
        let (snap, k) = (snapshot.clone(), key.clone());
        let now = tokio::task::spawn_blocking(move || snap.get(&k))
            .await
            .map_err(|e| StoreError::Aborted(format!("reading the store: {e}")))??;
        // (A state that does not decode is skipped: it was reported when first told.)
        let ev = match (&now, &said) {
            (Some(o), Said::Present(Some(json))) if *json == o.bytes => None,
            (Some(o), Said::Present(json)) => {
                decode
                    .decode(&o.key, &o.meta.resource_version, &o.bytes)
                    .ok()
                    .map(|new| {
                        let old = json
                            .as_ref()
                            .and_then(|j| decode.decode(&key, &ResourceVersion::default(), j).ok())
                            .unwrap_or_else(|| new.clone());
                        Event::Update {
                            old,
                            new,
                            resync: false,
                        }
                    })
            }
            (Some(o), Said::Absent | Said::Unknown) => decode
                .decode(&o.key, &o.meta.resource_version, &o.bytes)
                .ok()
                .map(|object| Event::Add { object, initial: false }),
            (None, Said::Absent) => None,
            (None, Said::Present(json)) => json
                .as_ref()
                .and_then(|j| decode.decode(&key, &ResourceVersion::default(), j).ok())
                .or_else(|| from_meta(&key_meta(&key)))
                .map(|object| Event::Delete {
                    object,
                    final_state_unknown: true,
                }),
            (None, Said::Unknown) => from_meta(&key_meta(&key)).map(|object| Event::Delete {
                object,
                final_state_unknown: true,
            }),
        };
        let said = now.map_or(Said::Absent, |o| Said::Present(Some(o.bytes)));
        told.note(position, &key, said);
        restored.insert(key);
        if let Some(ev) = ev {
            call(&ctx.report, handler, label, ev).await;
        }
    }
    // What came after the rollback up to the view, for every other key.
    let mut cursor = to;
    while cursor < position {
        let (log, scope) = (ctx.log.clone(), ctx.scope);
        let (entries, scanned) =
            tokio::task::spawn_blocking(move || log.read_scope_entries_after_contiguous(cursor, BATCH, scope))
                .await
                .map_err(|e| StoreError::Aborted(format!("reading the log: {e}")))??;
        for entry in entries.into_iter().filter(|e| e.seq() <= position) {
            let key = match &entry {
                LogEntry::Record(r) => Some(&r.key),
                LogEntry::Damaged(d) => d.key.as_ref(),
            };
            if key.is_some_and(|k| restored.contains(k)) {
                continue;
            }
            told.note_entry(&entry);
            match entry {
                LogEntry::Record(rec) => {
                    deliver(ctx, decode, handler, label, rec).await;
                }
                LogEntry::Damaged(d) => damaged(ctx, decode, handler, label, d, stop).await,
            }
        }
        if scanned <= cursor {
            break;
        }
        cursor = scanned;
    }
    told.settled();
    Ok(Some(position))
}

/// Metadata holding only `key`: what a delete is built from when no state of the object is left.
fn key_meta(key: &ObjectKey) -> ObjectMeta {
    ObjectMeta {
        namespace: key.namespace.clone(),
        name: key.name.clone(),
        ..ObjectMeta::default()
    }
}

/// The name of the marker a durable handler's initial adds leave while they run: the
/// position of the first view they were told from (see [`initial_adds`]).
fn pending_marker(name: &CursorName) -> CursorName {
    CursorName(format!("{name}#initial-adds"))
}

/// Synthetic adds of what is on disk, read from one view in pages, and the view's position,
/// persisted as the handler's cursor once they were all delivered (`None` when stopped). The
/// log after the view is pinned meanwhile, so compaction keeps what the handler reads next.
///
/// A round can fail halfway (a store error, a crash) after telling some adds; the next round
/// tells them again from a newer view, which no longer holds what was deleted in between. So
/// before telling anything, the round persists a marker cursor at its view's position (it
/// also holds compaction there, across restarts); a round that finds the marker of an earlier
/// one tells a delete (`final_state_unknown`) of each object deleted in the log since then
/// and absent from its own view. The cursor replaces the marker once the round is complete.
#[allow(clippy::too_many_arguments)] // two callers in one function
async fn initial_adds<K>(
    ctx: &Ctx,
    decode: &Decode<K>,
    handler: &dyn EventHandler<K>,
    label: &str,
    name: &CursorName,
    stop: &watch::Receiver<bool>,
    placed: &watch::Sender<bool>,
    told: Option<(&mut Told, u64)>,
) -> Result<Option<Seq>, StoreError>
where
    K: DeserializeOwned + Send + Sync + 'static,
{
    let marker = pending_marker(name);
    let (log, scope, m) = (ctx.log.clone(), ctx.scope, marker.clone());
    let earlier = tokio::task::spawn_blocking(move || log.cursor(scope, m))
        .await
        .map_err(|e| StoreError::Aborted(format!("reading the store: {e}")))??;
    let (snapshot, position) = durable_snapshot(ctx).await?;
    let _pin = ctx.writer.pin(earlier.unwrap_or(position).min(position));
    if earlier.is_none() {
        ctx.writer.set_cursor(ctx.scope, marker.clone(), position).await?;
    }
    // From here the log after `position` is kept for the handler.
    placed.send_replace(true);
    let snapshot = Arc::new(snapshot);
    let seen = told.as_ref().map(|(_, n)| *n);
    let told = told.map(|(t, _)| (t, position));
    if !snapshot_events(ctx, decode, handler, label, snapshot.clone(), false, stop, told).await? {
        return Ok(None);
    }
    if let Some(from) = earlier.filter(|e| *e < position) {
        if !deleted_since(ctx, decode, handler, label, snapshot, from, position, stop).await? {
            return Ok(None);
        }
    }
    let (set, unmark) = tokio::join!(
        save_cursor(ctx, name, position, seen),
        ctx.writer.delete_cursor(ctx.scope, marker)
    );
    set?;
    if let Err(e) = unmark {
        // Left behind, it only holds compaction back: removed at the handler's next start.
        (ctx.report)(store_issue(label, "cannot remove its initial adds' marker: ", e));
    }
    Ok(Some(position))
}

/// After an earlier round of initial adds from the view at `from` failed: a delete of every
/// object the log deleted in `(from, to]` that `snapshot` (at `to`) does not hold, so the
/// handler drops what that round told it and no longer exists. `Ok(false)` when stopped.
#[allow(clippy::too_many_arguments)] // one caller
async fn deleted_since<K>(
    ctx: &Ctx,
    decode: &Decode<K>,
    handler: &dyn EventHandler<K>,
    label: &str,
    snapshot: Arc<Snapshot>,
    from: Seq,
    to: Seq,
    stop: &watch::Receiver<bool>,
) -> Result<bool, StoreError>
where
    K: DeserializeOwned + Send + Sync + 'static,
{
    let mut deleted: std::collections::BTreeMap<ObjectKey, Option<LogRecord>> = std::collections::BTreeMap::new();
    let mut cursor = from;
    while cursor < to {
        let (log, scope) = (ctx.log.clone(), ctx.scope);
        let (entries, scanned) =
            tokio::task::spawn_blocking(move || log.read_scope_entries_after_contiguous(cursor, BATCH, scope))
                .await
                .map_err(|e| StoreError::Aborted(format!("reading the log: {e}")))??;
        for entry in entries.into_iter().filter(|e| e.seq() <= to) {
            match entry {
                LogEntry::Record(r) if r.kind == DeltaKind::Deleted => {
                    deleted.insert(r.key.clone(), Some(r));
                }
                LogEntry::Record(_) => {}
                LogEntry::Damaged(d) => {
                    if let Some(key) = d.key {
                        deleted.entry(key).or_insert(None);
                    }
                }
            }
        }
        if scanned <= cursor {
            break;
        }
        cursor = scanned;
    }
    for (key, rec) in deleted {
        if *stop.borrow() {
            return Ok(false);
        }
        let (snap, k) = (snapshot.clone(), key.clone());
        let held = tokio::task::spawn_blocking(move || snap.get_with(&k, |_, _| Ok(())))
            .await
            .map_err(|e| StoreError::Aborted(format!("reading the store: {e}")))??;
        if held.is_some() {
            continue;
        }
        let last_state = rec.as_ref().and_then(|r| {
            let bytes = r.object.as_ref().or(r.old.as_ref())?;
            decode.decode(&key, &ResourceVersion::default(), bytes).ok()
        });
        if let Some(object) = last_state.or_else(|| from_meta::<K>(&key_meta(&key))) {
            let ev = Event::Delete {
                object,
                final_state_unknown: true,
            };
            call(&ctx.report, handler, label, ev).await;
        }
    }
    Ok(true)
}

/// A resync: `Update { old = new }` for every stored object, read from one view in pages.
async fn resync<K>(
    ctx: &Ctx,
    decode: &Decode<K>,
    handler: &dyn EventHandler<K>,
    label: &str,
    stop: &watch::Receiver<bool>,
) where
    K: DeserializeOwned + Send + Sync + 'static,
{
    let store = ctx.store.clone();
    let snapshot = tokio::task::spawn_blocking(move || store.snapshot()).await;
    match snapshot {
        Ok(Ok(s)) => {
            if let Err(e) = snapshot_events(ctx, decode, handler, label, Arc::new(s), true, stop, None).await {
                (ctx.report)(store_issue(label, "resync could not read the store: ", e));
            }
        }
        Ok(Err(e)) => (ctx.report)(store_issue(label, "resync could not read the store: ", e)),
        Err(_) => {}
    }
}

/// Every object of `snapshot`, in pages read on a blocking thread, as synthetic adds or (`resync`)
/// resync updates. `Ok(false)` when stopped.
#[allow(clippy::too_many_arguments)] // three callers
async fn snapshot_events<K>(
    ctx: &Ctx,
    decode: &Decode<K>,
    handler: &dyn EventHandler<K>,
    label: &str,
    snapshot: Arc<Snapshot>,
    resync: bool,
    stop: &watch::Receiver<bool>,
    mut told: Option<(&mut Told, Seq)>,
) -> Result<bool, StoreError>
where
    K: DeserializeOwned + Send + Sync + 'static,
{
    let mut after: Option<Vec<u8>> = None;
    loop {
        if *stop.borrow() {
            return Ok(false);
        }
        let (snap, from) = (snapshot.clone(), after.clone());
        let (page, last) = tokio::task::spawn_blocking(move || snap.list_entries_after(from.as_deref(), BATCH))
            .await
            .map_err(|e| StoreError::Aborted(format!("reading the store: {e}")))??;
        let Some(last) = last else { return Ok(true) };
        after = Some(last);
        for entry in page {
            let o = match entry {
                ObjectEntry::Object(o) => o,
                // Skipped and reported, as a damaged log entry is: the handler hears of the
                // object once the reflector writes it again (a relist replaces damaged rows).
                ObjectEntry::Damaged { key: Some(key), error } => {
                    let message = format!("its stored row is damaged and was skipped: {error}");
                    (ctx.report)(undecodable(label, &key, None, &message));
                    continue;
                }
                ObjectEntry::Damaged { key: None, error } => {
                    (ctx.report)(store_issue(label, "a damaged stored row was skipped: ", error));
                    continue;
                }
            };
            if let Some((t, at)) = told.as_mut() {
                t.note(*at, &o.key, Said::Present(Some(o.bytes.clone())));
            }
            match decode.decode(&o.key, &o.meta.resource_version, &o.bytes) {
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
                    call(&ctx.report, handler, label, ev).await;
                }
                Err(e) => (ctx.report)(undecodable(label, &o.key, None, &e.to_string())),
            }
        }
    }
}

/// Keeps the handler's `handler_lag_entries` gauge at "committed − cursor" as either moves, so
/// a handler stuck in a callback shows a growing lag rather than its last value. Runs until the
/// handler's task ends.
pub(crate) async fn track_lag(
    committed: watch::Receiver<Seq>,
    position: watch::Receiver<Seq>,
    done: watch::Receiver<bool>,
    labels: super::metrics::HandlerLabels,
) {
    let gauge = super::metrics::handler_lag().get_or_create(&labels).clone();
    // A handler that is gone leaves no series behind.
    let _remove = RemoveOnDrop(labels);
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

struct RemoveOnDrop(super::metrics::HandlerLabels);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        super::metrics::handler_lag().remove(&self.0);
    }
}

#[cfg(test)]
mod told_tests {
    use super::*;

    fn key(name: &str) -> ObjectKey {
        ObjectKey::namespaced("ns", name)
    }

    #[test]
    fn told_keeps_the_last_state_per_key_and_what_came_after_a_seq() {
        let mut t = Told::default();
        t.note(Seq(1), &key("a"), Said::Present(Some(bytes::Bytes::from_static(b"{}"))));
        t.note(Seq(2), &key("b"), Said::Present(None));
        t.note(Seq(3), &key("a"), Said::Absent);
        assert_eq!(t.keys.len(), 2);
        assert_eq!(t.json_bytes, 0, "the replaced JSON is no longer counted");
        let after: Vec<String> = t.after(Seq(1)).into_iter().map(|(k, _)| k.to_string()).collect();
        assert_eq!(after, ["ns/a", "ns/b"]);
        assert!(matches!(t.after(Seq(2)).as_slice(), [(_, Said::Absent)]));
        assert!(t.after(Seq(3)).is_empty());
    }

    #[test]
    fn told_stops_keeping_json_past_its_bytes_and_keys_past_its_count() {
        let mut t = Told::default();
        let big = bytes::Bytes::from(vec![b' '; TOLD_JSON_BYTES]);
        t.note(Seq(1), &key("a"), Said::Present(Some(big.clone())));
        t.note(Seq(2), &key("b"), Said::Present(Some(big)));
        assert!(matches!(t.keys.get(&key("b")), Some((_, Said::Present(None)))));
        assert_eq!(t.json_bytes, TOLD_JSON_BYTES);
        for i in 0..=TOLD_KEYS {
            t.note(Seq(3), &key(&format!("k{i}")), Said::Absent);
        }
        assert!(t.overflowed && t.keys.is_empty() && t.json_bytes == 0);
        t.note(Seq(4), &key("c"), Said::Absent);
        assert!(t.keys.is_empty(), "nothing is kept while overflowed");
        t.settled();
        t.note(Seq(5), &key("c"), Said::Absent);
        assert_eq!(t.keys.len(), 1);
    }
}
