//! The controller's run: build and sync the informers, then hand due keys to reconciles (at most
//! `concurrency` at once, one per key), each in its own task and span, and stream the results.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::{self, BoxFuture};
use futures::{FutureExt, Stream, StreamExt};
use kube::core::DynamicObject;
use kube::runtime::controller::ReconcileReason;
use kube::runtime::reflector::ObjectRef;
use kube::Resource;
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tracing::Instrument;

use super::action::{requeue_rate_limited, Action, Next};
use super::schedule::Enqueue;
use super::trigger::{passes_entries, Armed};
use super::{Controller, DeleteHook, Error};
use crate::informer::{async_handler_fn, Event, HandlerOptions, Informer, InformerError, Lister, Watched};
use crate::leader::Leadership;
use crate::metrics::ReconcileResult;
use crate::object::ObjectKey;
use crate::queue::WorkQueue;
use crate::util::Locked;

/// Results not yet read by the stream's consumer; reconciles wait (holding their slot) when
/// it is full, so a consumer that stops reading slows the controller down instead of growing
/// memory.
const RESULTS_BUFFERED: usize = 64;

/// How often a follower looks at a fenced leadership that may have been renewed.
const LEADERSHIP_POLL: Duration = Duration::from_millis(100);

type Item<K, E> = Result<(ObjectRef<K>, Action), Error<E>>;

/// The stream [`Controller::run`] returns: the results channel, and the driver task, started on
/// the first poll and aborted when the stream is dropped.
struct RunStream<T> {
    rx: mpsc::Receiver<T>,
    start: Option<BoxFuture<'static, ()>>,
    driver: Option<AbortOnDrop>,
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<T> Stream for RunStream<T> {
    type Item = T;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        if let Some(start) = self.start.take() {
            self.driver = Some(AbortOnDrop(tokio::spawn(start)));
        }
        self.rx.poll_recv(cx)
    }
}

pub(super) fn stream<K, Ctx, F, Fut, E, P>(
    controller: Controller<K>,
    reconcile: F,
    error_policy: P,
    ctx: Arc<Ctx>,
) -> impl Stream<Item = Item<K, E>> + Send + 'static
where
    K: Resource + DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Clone + Send + Sync,
    Ctx: Send + Sync + 'static,
    F: Fn(Arc<K>, Arc<Ctx>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: std::error::Error + Send + 'static,
    P: Fn(Arc<K>, &E, Arc<Ctx>) -> Action + Send + Sync + 'static,
{
    let (tx, rx) = mpsc::channel(RESULTS_BUFFERED);
    let span = tracing::info_span!("controller", controller = %controller.name);
    let reconciler = Arc::new(Reconciler {
        reconcile,
        error_policy,
        ctx,
        tx,
        name: controller.name.clone(),
    });
    RunStream {
        rx,
        start: Some(drive(controller, reconciler).instrument(span).boxed()),
        driver: None,
    }
}

/// Widens a trigger's error (which carries no reconcile error) to the stream's.
fn widen<E: std::error::Error>(e: Error<std::convert::Infallible>) -> Error<E> {
    match e {
        Error::Informer(e) => Error::Informer(e),
        Error::NoDatabase(what) => Error::NoDatabase(what),
        Error::Store(e, r) => Error::Store(e, r),
        Error::ObjectNotFound(r) => Error::ObjectNotFound(r),
        Error::ReconcilerPanicked(m, r) => Error::ReconcilerPanicked(m, r),
        Error::DeleteHookFailed(e, r) => Error::DeleteHookFailed(e, r),
        Error::ReconcilerFailed(never, _) => match never {},
    }
}

/// The first of `futures` to resolve; never, when there is none.
fn first_of(futures: Vec<BoxFuture<'static, ()>>) -> BoxFuture<'static, ()> {
    if futures.is_empty() {
        future::pending().boxed()
    } else {
        future::select_all(futures).map(|_| ()).boxed()
    }
}

/// Deleted objects waiting for the delete hook, with the handler calls waiting for it to succeed.
type Tombstones<K> = Arc<Mutex<HashMap<ObjectKey, (Arc<K>, Vec<oneshot::Sender<()>>)>>>;

async fn drive<K, Ctx, F, Fut, E, P>(controller: Controller<K>, rec: Arc<Reconciler<Ctx, F, P, Item<K, E>>>)
where
    K: Resource + DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Clone + Send + Sync,
    Ctx: Send + Sync + 'static,
    F: Fn(Arc<K>, Arc<Ctx>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: std::error::Error + Send + 'static,
    P: Fn(Arc<K>, &E, Arc<Ctx>) -> Action + Send + Sync + 'static,
{
    let Controller {
        db,
        primary,
        triggers,
        predicates,
        config,
        name,
        queue,
        leading,
        reconcile_on,
        reconcile_all_on,
        graceful,
        forceful,
        on_delete,
        dyntype,
    } = controller;
    let mut forceful = first_of(forceful);
    let mut graceful = first_of(graceful);
    let enqueue = Enqueue::new(queue.clone(), config.debounce);
    let mut aux = JoinSet::new();
    aux.spawn(enqueue.clone().run_debounce());

    let primary = match primary.informer_with(db.as_deref(), "Controller::new", &dyntype).await {
        Ok(i) => i,
        Err(e) => {
            let _ = rec.tx.send(Err(widen(e))).await;
            return;
        }
    };
    // Keys as the informer's cache takes each change: with no predicate, no object is decoded
    // (its metadata was scanned once, on arrival). Deletes go to the delete hook, if any.
    let enq = enqueue.clone();
    let on_change = move |c: Watched<'_, K>| {
        let Some(new) = c.new else { return };
        if let Some(old) = c.old {
            if !Arc::ptr_eq(old, new) && !passes_entries(&predicates, old, new) {
                return;
            }
        }
        enq.add(c.key.clone(), || ReconcileReason::ObjectUpdated);
    };
    let mut registrations = vec![primary.watch_changes(on_change, HandlerOptions::volatile())];
    primary.start();
    let mut waits: Vec<BoxFuture<'static, Result<(), InformerError>>> = Vec::new();
    let mut related = Vec::new();
    for t in triggers {
        match t(db.clone(), enqueue.clone()).await {
            Ok(Armed {
                registration,
                synced,
                informer,
            }) => {
                registrations.push(registration);
                waits.push(synced);
                related.push(informer);
            }
            Err(e) => {
                let _ = rec.tx.send(Err(widen(e))).await;
                remove_all(registrations).await;
                return;
            }
        }
    }
    let tombstones: Tombstones<K> = Arc::default();
    // Not waited for: its backlog of deletions waits for reconciles, which wait for sync.
    let delete_handler = on_delete
        .as_ref()
        .map(|_| delete_handler(&primary, &name, &enqueue, &tombstones));

    // Every cache before the first reconcile (client-go's WaitForCacheSync).
    let all_synced = async {
        primary.wait_for_sync().await?;
        for w in waits {
            w.await?;
        }
        for r in &registrations {
            r.wait_for_sync().await?;
        }
        Ok::<_, InformerError>(())
    };
    let synced = tokio::select! {
        r = all_synced => Some(r),
        () = &mut graceful => None,
        () = &mut forceful => None,
    };
    match synced {
        Some(Ok(())) => {}
        stopped_or_failed => {
            if let Some(Err(e)) = stopped_or_failed {
                let _ = rec.tx.send(Err(Error::Informer(e))).await;
            }
            remove_all(registrations).await;
            if let Some(d) = delete_handler {
                d.remove().await;
            }
            return;
        }
    }
    for trigger in reconcile_on {
        let enq = enqueue.clone();
        aux.spawn(trigger.for_each(move |r| {
            let key = ObjectKey {
                namespace: r.namespace,
                name: r.name,
            };
            enq.add(key, || ReconcileReason::Unknown);
            future::ready(())
        }));
    }
    for trigger in reconcile_all_on {
        let (enq, primary) = (enqueue.clone(), primary.clone());
        aux.spawn(trigger.for_each(move |()| {
            let (enq, primary) = (enq.clone(), primary.clone());
            async move { enqueue_all(&primary, &enq, || ReconcileReason::BulkReconcile).await }
        }));
    }

    let shared = Shared {
        dyntype,
        lister: primary.lister(),
        metadata: primary.metadata(),
        enqueue: enqueue.clone(),
        tombstones,
        on_delete,
    };
    let concurrency = usize::from(config.concurrency);
    // Reconcile tasks (returning nothing) and batch reads (returning the keys they read).
    let mut in_flight: JoinSet<Vec<Taken<K>>> = JoinSet::new();
    // Keys taken and not yet done (their `Done` guards count them).
    let running = Arc::new(AtomicUsize::new(0));
    let mut lead = leading.map(Lead::new);
    if lead.is_none() {
        tracing::info!(concurrency, "caches synced; reconciling");
    }
    let mut shutting_down = false;
    loop {
        if let Some(l) = &mut lead {
            l.observe(&primary, &enqueue).await;
        }
        let busy = running.load(Ordering::Acquire);
        let room = if concurrency == 0 {
            BATCH
        } else {
            concurrency.saturating_sub(busy).min(BATCH)
        };
        let may_take = !shutting_down && lead.as_ref().is_none_or(|l| l.was_leading) && room > 0;
        tokio::select! {
            biased;
            () = &mut forceful => {
                tracing::info!("forced shutdown: not waiting for {} reconciles", running.load(Ordering::Acquire));
                if let Some(d) = &delete_handler {
                    d.stop();
                }
                return;
            }
            () = &mut graceful, if !shutting_down => {
                tracing::info!(in_flight = running.load(Ordering::Acquire), "graceful shutdown: finishing the reconciles in flight");
                shutting_down = true;
                queue.shutdown();
            }
            Some(done) = in_flight.join_next(), if !in_flight.is_empty() => match done {
                Ok(read) => {
                    for t in read {
                        spawn_reconcile(&mut in_flight, &rec, &shared, t);
                    }
                }
                Err(e) => tracing::error!(error = %e, "reconcile task failed"),
            },
            keys = queue.get_many(room), if may_take => {
                let Some(keys) = keys else {
                    // Shut down from outside (`queue().shutdown()`): as a graceful shutdown.
                    shutting_down = true;
                    continue;
                };
                if lead.as_ref().is_some_and(|l| !l.leadership.is_leading()) {
                    // The term ran out (a pause?) before the elector noticed: hand them back.
                    for key in keys {
                        queue.add(key.clone());
                        queue.done(&key);
                    }
                    continue;
                }
                take(keys, &mut in_flight, &rec, &shared, &running);
            }
            () = lead_changed(lead.as_mut()), if lead.is_some() && !shutting_down => {}
        }
        if shutting_down && in_flight.is_empty() {
            break;
        }
    }
    remove_all(registrations).await;
    if let Some(d) = delete_handler {
        d.remove().await;
    }
    // Held until here: the related informers run as long as the controller.
    drop(related);
    tracing::info!("controller stopped");
}

async fn remove_all(registrations: impl IntoIterator<Item = crate::informer::Registration>) {
    for r in registrations {
        r.remove().await;
    }
}

/// Enqueues every primary object (the keys read off the runtime: it is a scan of redb).
async fn enqueue_all<K>(primary: &Informer<K>, enqueue: &Enqueue, reason: impl Fn() -> ReconcileReason)
where
    K: DeserializeOwned + Send + Sync + 'static,
{
    let store = primary.store();
    match tokio::task::spawn_blocking(move || store.list_keys()).await {
        Ok(Ok(keys)) => keys.into_iter().for_each(|k| enqueue.add(k, &reason)),
        Ok(Err(e)) => tracing::warn!(error = %e, "listing the objects to reconcile failed"),
        Err(e) => tracing::warn!(error = %e, "listing the objects to reconcile failed"),
    }
}

/// The durable handler that turns deletions into tombstones for the delete hook; each call
/// returns once the hook has succeeded, or fails when the controller stops first.
struct DeleteHandler {
    registration: crate::informer::Registration,
    stopping: tokio::sync::watch::Sender<bool>,
}

impl DeleteHandler {
    /// Stops delivery, then fails the calls still waiting for a hook. In that order: a call
    /// that fails once its handler is stopped is not delivered (its cursor stays before it),
    /// so the next start tells that deletion again, and the ones whose hook succeeded are not.
    fn stop(&self) {
        let _ = self.registration.stop.send(true);
        self.stopping.send_replace(true);
    }

    async fn remove(self) {
        self.stop();
        self.registration.remove().await;
    }
}

fn delete_handler<K>(primary: &Informer<K>, name: &str, enqueue: &Enqueue, tombstones: &Tombstones<K>) -> DeleteHandler
where
    K: Resource + DeserializeOwned + Send + Sync + 'static,
{
    let (enqueue, tombstones) = (enqueue.clone(), tombstones.clone());
    let (stopping, stopped) = tokio::sync::watch::channel(false);
    let handler = async_handler_fn(move |ev: Event<K>| {
        let (enqueue, tombstones, mut stopped) = (enqueue.clone(), tombstones.clone(), stopped.clone());
        async move {
            let Event::Delete { object, .. } = ev else {
                return Ok(());
            };
            let meta = object.meta();
            let Some(name) = meta.name.clone() else {
                return Ok(());
            };
            let key = ObjectKey {
                namespace: meta.namespace.clone(),
                name,
            };
            let (tx, rx) = oneshot::channel();
            {
                let mut t = tombstones.locked();
                let slot = t.entry(key.clone()).or_insert_with(|| (object.clone(), Vec::new()));
                slot.0 = object;
                slot.1.push(tx);
            }
            enqueue.add(key, || ReconcileReason::Custom {
                reason: "object deleted".into(),
            });
            const STOPPED: &str = "the controller stopped before the delete hook succeeded";
            tokio::select! {
                // A hook that succeeded counts, even when the stop came too.
                biased;
                r = rx => r.map_err(|_| STOPPED),
                _ = stopped.wait_for(|s| *s) => Err(STOPPED),
            }
        }
    });
    DeleteHandler {
        registration: primary.add_event_handler(handler, HandlerOptions::durable(format!("{name}-deletes"))),
        stopping,
    }
}

/// A primary object's reference, from its key.
fn object_ref<K: Resource>(key: &ObjectKey, dyntype: &K::DynamicType) -> ObjectRef<K>
where
    K::DynamicType: Clone,
{
    let mut r = ObjectRef::<K>::new_with(&key.name, dyntype.clone());
    r.namespace = key.namespace.clone();
    r
}

fn erase<K: Resource>(r: &ObjectRef<K>) -> Box<ObjectRef<DynamicObject>>
where
    K::DynamicType: Clone,
{
    Box::new(r.clone().erase())
}

/// Marks its key done when dropped (also when the task is aborted or the error policy panics:
/// otherwise the key is never handed out again), and frees its slot.
struct Done {
    queue: WorkQueue<ObjectKey>,
    key: ObjectKey,
    running: Arc<AtomicUsize>,
}

impl Done {
    fn new(queue: &WorkQueue<ObjectKey>, key: ObjectKey, running: &Arc<AtomicUsize>) -> Self {
        running.fetch_add(1, Ordering::AcqRel);
        Self {
            queue: queue.clone(),
            key,
            running: running.clone(),
        }
    }
}

impl Drop for Done {
    fn drop(&mut self) {
        self.queue.done(&self.key);
        self.running.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The most keys taken from the queue at once. A burst (every object at startup, a relist)
/// is read from the cache in one go, with one blocking read for what the cache holds only on
/// disk, instead of a wake-up and a blocking-thread hop per key.
const BATCH: usize = 128;

/// What reading an object gives.
type Read<K> = Result<Option<Arc<K>>, crate::store::StoreError>;

/// A key taken from the queue, on its way to its reconcile.
struct Taken<K> {
    done: Done,
    reason: ReconcileReason,
    /// The object read already (`None`: read by the reconcile task, after a delete hook).
    read: Option<Read<K>>,
}

/// Starts the turns of `keys`: those the cache answers for at once (or with a tombstone to
/// hand the delete hook), the others after one blocking read for all of them.
fn take<K, Ctx, F, Fut, E, P>(
    keys: Vec<ObjectKey>,
    in_flight: &mut JoinSet<Vec<Taken<K>>>,
    rec: &Arc<Reconciler<Ctx, F, P, Item<K, E>>>,
    shared: &Shared<K>,
    running: &Arc<AtomicUsize>,
) where
    K: Resource + DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Clone + Send + Sync,
    Ctx: Send + Sync + 'static,
    F: Fn(Arc<K>, Arc<Ctx>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: std::error::Error + Send + 'static,
    P: Fn(Arc<K>, &E, Arc<Ctx>) -> Action + Send + Sync + 'static,
{
    let mut cold = Vec::new();
    for key in keys {
        let reason = shared.enqueue.take_reason(&key);
        let tombstone = shared.on_delete.is_some() && shared.tombstones.locked().contains_key(&key);
        let read = if tombstone {
            Some(None)
        } else {
            shared.lister.get_cached(&key).map(Some)
        };
        let done = Done::new(&shared.enqueue.queue, key, running);
        match read {
            Some(read) => spawn_reconcile(in_flight, rec, shared, Taken { done, reason, read }),
            None => cold.push(Taken {
                done,
                reason,
                read: None,
            }),
        }
    }
    if cold.is_empty() {
        return;
    }
    let lister = shared.lister.clone();
    in_flight.spawn(async move {
        let keys: Vec<ObjectKey> = cold.iter().map(|t| t.done.key.clone()).collect();
        let reads = tokio::task::spawn_blocking(move || lister.get_many(&keys)).await;
        match reads {
            Ok(reads) => {
                for (t, r) in cold.iter_mut().zip(reads) {
                    t.read = Some(r);
                }
            }
            Err(e) => {
                for t in &mut cold {
                    t.read = Some(Err(crate::store::StoreError::Panicked {
                        what: "a cache read".into(),
                        message: e.to_string(),
                    }));
                }
            }
        }
        cold
    });
}

/// Spawns the reconcile of one key, in its span.
fn spawn_reconcile<K, Ctx, F, Fut, E, P>(
    in_flight: &mut JoinSet<Vec<Taken<K>>>,
    rec: &Arc<Reconciler<Ctx, F, P, Item<K, E>>>,
    shared: &Shared<K>,
    t: Taken<K>,
) where
    K: Resource + DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Clone + Send + Sync,
    Ctx: Send + Sync + 'static,
    F: Fn(Arc<K>, Arc<Ctx>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: std::error::Error + Send + 'static,
    P: Fn(Arc<K>, &E, Arc<Ctx>) -> Action + Send + Sync + 'static,
{
    let obj_ref = object_ref::<K>(&t.done.key, &shared.dyntype);
    let span = tracing::info_span!(
        "reconciling object",
        "object.ref" = %obj_ref,
        object.reason = %t.reason,
    );
    let (rec, shared) = (rec.clone(), shared.clone());
    in_flight.spawn(
        async move {
            let Taken { done, read, .. } = t;
            rec.process(&shared, done.key.clone(), obj_ref, read).await;
            drop(done);
            Vec::new()
        }
        .instrument(span),
    );
}

/// What every reconcile task of one run shares besides the reconciler.
struct Shared<K: Resource> {
    /// The primary's resource type (`()` for a typed `K`), for its object references.
    dyntype: K::DynamicType,
    lister: Lister<K>,
    metadata: crate::informer::Metadata,
    enqueue: Enqueue,
    tombstones: Tombstones<K>,
    on_delete: Option<DeleteHook<K>>,
}

impl<K: Resource + DeserializeOwned + Send + Sync + 'static> Shared<K> {
    /// One object: from the cache when it holds it, else from redb off the runtime.
    async fn read(&self, key: &ObjectKey) -> Read<K> {
        if let Some(hit) = self.lister.get_cached(key) {
            return hit;
        }
        let (lister, k) = (self.lister.clone(), key.clone());
        tokio::task::spawn_blocking(move || lister.get_by_key(&k))
            .await
            .unwrap_or_else(|e| {
                Err(crate::store::StoreError::Panicked {
                    what: "a cache read".into(),
                    message: e.to_string(),
                })
            })
    }
}

impl<K: Resource> Clone for Shared<K>
where
    K::DynamicType: Clone,
{
    fn clone(&self) -> Self {
        Self {
            dyntype: self.dyntype.clone(),
            lister: self.lister.clone(),
            metadata: self.metadata.clone(),
            enqueue: self.enqueue.clone(),
            tombstones: self.tombstones.clone(),
            on_delete: self.on_delete.clone(),
        }
    }
}

struct Reconciler<Ctx, F, P, T> {
    reconcile: F,
    error_policy: P,
    ctx: Arc<Ctx>,
    tx: mpsc::Sender<T>,
    name: String,
}

impl<K, Ctx, F, Fut, E, P> Reconciler<Ctx, F, P, Item<K, E>>
where
    K: Resource + DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Clone + Send + Sync,
    Ctx: Send + Sync + 'static,
    F: Fn(Arc<K>, Arc<Ctx>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: std::error::Error + Send + 'static,
    P: Fn(Arc<K>, &E, Arc<Ctx>) -> Action + Send + Sync + 'static,
{
    /// One turn of `key`: the delete hook if it was deleted, else a reconcile of its current
    /// state (`read` when given, unless the hook ran: then read after it); then what comes
    /// next, and the result on the stream.
    async fn process(&self, shared: &Shared<K>, key: ObjectKey, obj_ref: ObjectRef<K>, mut read: Option<Read<K>>) {
        let _busy = crate::metrics::global().busy(&self.name);
        let queue = &shared.enqueue.queue;
        let tombstone = shared.tombstones.locked().get(&key).map(|(o, _)| o.clone());
        if let (Some(deleted), Some(hook)) = (tombstone, &shared.on_delete) {
            read = None;
            match AssertUnwindSafe(hook(deleted)).catch_unwind().await {
                Ok(Ok(())) => {
                    if let Some((_, waiters)) = shared.tombstones.locked().remove(&key) {
                        for w in waiters {
                            let _ = w.send(());
                        }
                    }
                    queue.forget(&key);
                    // Created again under its name meanwhile: reconcile that one too (its
                    // metadata, from memory, tells).
                    if !matches!(shared.metadata.get(&key), Ok(Some(_))) {
                        return;
                    }
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "delete hook failed");
                    queue.add_rate_limited(key.clone());
                    let _ = self.tx.send(Err(Error::DeleteHookFailed(e, erase(&obj_ref)))).await;
                    return;
                }
                Err(panic) => {
                    let msg = crate::util::panic_message(panic.as_ref());
                    tracing::error!(panic = msg, "delete hook panicked");
                    crate::metrics::global().observe_panic(&self.name);
                    queue.add_rate_limited(key.clone());
                    let _ = self.tx.send(Err(Error::ReconcilerPanicked(msg, erase(&obj_ref)))).await;
                    return;
                }
            }
        }
        let read = match read {
            Some(read) => read,
            None => shared.read(&key).await,
        };
        let obj = match read {
            Ok(Some(obj)) => obj,
            Ok(None) => {
                let _ = self.tx.send(Err(Error::ObjectNotFound(erase(&obj_ref)))).await;
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading the object from the cache failed");
                queue.add_rate_limited(key);
                let _ = self.tx.send(Err(Error::Store(e, erase(&obj_ref)))).await;
                return;
            }
        };
        let started = std::time::Instant::now();
        let (reconcile, ctx, o) = (&self.reconcile, self.ctx.clone(), obj.clone());
        // Inside the async block, so that a panic in the call itself is caught too.
        let result = AssertUnwindSafe(async move { reconcile(o, ctx).await })
            .catch_unwind()
            .await;
        let took = started.elapsed();
        let item = match result {
            Ok(Ok(action)) => {
                let next = Next::of(&action);
                let outcome = match next {
                    Next::AwaitChange => ReconcileResult::Success,
                    Next::After(_) => ReconcileResult::RequeueAfter,
                    Next::RateLimited => ReconcileResult::Requeue,
                };
                self.observe(outcome, took);
                if next != Next::RateLimited {
                    queue.forget(&key);
                }
                self.schedule(shared, &key, next, ReconcileReason::ReconcilerRequestedRetry);
                Ok((obj_ref, action))
            }
            Ok(Err(e)) => {
                self.observe(ReconcileResult::Error, took);
                tracing::warn!(error = %e, requeues = queue.num_requeues(&key), "reconcile failed");
                let action = (self.error_policy)(obj, &e, self.ctx.clone());
                self.schedule(
                    shared,
                    &key,
                    Next::of(&action),
                    ReconcileReason::ErrorPolicyRequestedRetry,
                );
                Err(Error::ReconcilerFailed(e, erase(&obj_ref)))
            }
            Err(panic) => {
                self.observe(ReconcileResult::Panic, took);
                let msg = crate::util::panic_message(panic.as_ref());
                tracing::error!(panic = msg, "reconcile panicked");
                self.schedule(
                    shared,
                    &key,
                    Next::of(&requeue_rate_limited()),
                    ReconcileReason::ErrorPolicyRequestedRetry,
                );
                Err(Error::ReconcilerPanicked(msg, erase(&obj_ref)))
            }
        };
        let _ = self.tx.send(item).await;
    }

    fn observe(&self, result: ReconcileResult, took: Duration) {
        crate::metrics::global().observe_reconcile(&self.name, result, took);
    }

    fn schedule(&self, shared: &Shared<K>, key: &ObjectKey, next: Next, reason: ReconcileReason) {
        let queue = &shared.enqueue.queue;
        match next {
            Next::AwaitChange => {}
            Next::After(d) => {
                shared.enqueue.note(key, || reason);
                queue.add_after(key.clone(), d);
            }
            Next::RateLimited => {
                shared.enqueue.note(key, || reason);
                queue.add_rate_limited(key.clone());
            }
        }
    }
}

/// Leadership as the run loop follows it.
struct Lead {
    leadership: Leadership,
    flag: tokio::sync::watch::Receiver<bool>,
    was_leading: bool,
    elector_gone: bool,
}

impl Lead {
    fn new(leadership: Leadership) -> Self {
        tracing::info!("caches synced; waiting for leadership");
        Self {
            flag: leadership.flag(),
            leadership,
            was_leading: false,
            elector_gone: false,
        }
    }

    /// Notes a change of leadership: on winning, every object is enqueued (what the previous
    /// leader did is unknown).
    async fn observe<K>(&mut self, primary: &Informer<K>, enqueue: &Enqueue)
    where
        K: DeserializeOwned + Send + Sync + 'static,
    {
        // A dropped elector keeps its last value, which must not count as leadership.
        let leading = !self.elector_gone && self.leadership.is_leading();
        if leading && !self.was_leading {
            enqueue_all(primary, enqueue, || ReconcileReason::Custom {
                reason: "leadership acquired".into(),
            })
            .await;
            tracing::info!("leading; reconciling");
        } else if !leading && self.was_leading {
            tracing::warn!("leadership lost; no new reconciles");
        }
        self.was_leading = leading;
    }
}

/// Resolves when leadership may have changed: the flag moved, or (not leading) a poll, since a
/// fenced term is renewed without moving the flag.
async fn lead_changed(lead: Option<&mut Lead>) {
    let Some(l) = lead else {
        return future::pending().await;
    };
    if l.elector_gone {
        return future::pending().await;
    }
    let was_leading = l.was_leading;
    let poll = async move {
        if was_leading {
            future::pending::<()>().await;
        } else {
            tokio::time::sleep(LEADERSHIP_POLL).await;
        }
    };
    tokio::select! {
        r = l.flag.changed() => if r.is_err() {
            l.elector_gone = true;
            if was_leading {
                tracing::warn!("the elector is gone; no new reconciles");
            }
        },
        () = poll => {}
    }
}
