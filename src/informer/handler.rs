//! Event handlers: what a handler receives, the ways to write one (sync closures, async
//! closures, client-go style add/update/delete funcs, filters), and the registration handle.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::sync::watch;

use crate::store::CursorName;

/// One event delivered to a handler.
#[derive(Debug)]
pub enum Event<K> {
    /// A new object; `initial` (client-go's `isInInitialList`) for the synthetic adds a new
    /// handler gets for what the store already holds, and for the adds of the informer's
    /// initial LIST (when its store was not restored from disk).
    Add {
        /// The object.
        object: Arc<K>,
        /// Part of the handler's initial list.
        initial: bool,
    },
    /// A changed object; `resync` for periodic resyncs (then `old` and `new` are the same).
    Update {
        /// The previous state.
        old: Arc<K>,
        /// The new state.
        new: Arc<K>,
        /// A periodic resync rather than a change.
        resync: bool,
    },
    /// A removed object.
    Delete {
        /// Its final state, or, when `final_state_unknown`, the last state the store knew (the
        /// delete was found by a relist: client-go's `DeletedFinalStateUnknown`).
        object: Arc<K>,
        /// See `object`.
        final_state_unknown: bool,
    },
}

impl<K> Clone for Event<K> {
    fn clone(&self) -> Self {
        match self {
            Event::Add { object, initial } => Event::Add {
                object: object.clone(),
                initial: *initial,
            },
            Event::Update { old, new, resync } => Event::Update {
                old: old.clone(),
                new: new.clone(),
                resync: *resync,
            },
            Event::Delete {
                object,
                final_state_unknown,
            } => Event::Delete {
                object: object.clone(),
                final_state_unknown: *final_state_unknown,
            },
        }
    }
}

impl<K> Event<K> {
    /// The object the event is about (the new state for updates).
    #[must_use]
    pub fn object(&self) -> &Arc<K> {
        match self {
            Event::Add { object, .. } | Event::Delete { object, .. } => object,
            Event::Update { new, .. } => new,
        }
    }
}

/// A handler's failure; reported (as [`HandlerProblem::Failed`](super::HandlerProblem::Failed)),
/// never fatal to other handlers. It keeps the handler's own error, so a caller can get it
/// back with [`downcast_ref`](Self::downcast_ref).
///
/// ```
/// use durable_informer::informer::HandlerError;
/// #[derive(Debug, thiserror::Error)]
/// #[error("quota exceeded")]
/// struct Quota;
/// let e = HandlerError::new(Quota);
/// assert_eq!(e.to_string(), "quota exceeded");
/// assert!(e.downcast_ref::<Quota>().is_some());
/// ```
#[derive(Debug, Clone)]
pub struct HandlerError(Arc<dyn std::error::Error + Send + Sync + 'static>);

impl HandlerError {
    /// Wraps an error (or a message: `String` and `&str` convert too).
    pub fn new(error: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        Self(Arc::from(error.into()))
    }

    /// The handler's error as `E`, if it was one.
    #[must_use]
    pub fn downcast_ref<E: std::error::Error + 'static>(&self) -> Option<&E> {
        self.0.downcast_ref::<E>()
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

// The handler's error is this error (Display forwards to it), so its source is the inner one's.
impl std::error::Error for HandlerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// Something that handles events of `K`. Usually built with [`handler_fn`],
/// [`async_handler_fn`] or [`HandlerFuncs`].
pub trait EventHandler<K>: Send + Sync + 'static {
    /// Handles one event. The dispatcher awaits it before the next event of this handler.
    fn handle(&self, event: Event<K>) -> BoxFuture<'_, Result<(), HandlerError>>;
}

struct SyncFn<F>(F);

impl<K, F, E> EventHandler<K> for SyncFn<F>
where
    K: Send + Sync + 'static,
    F: Fn(Event<K>) -> Result<(), E> + Send + Sync + 'static,
    E: Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
{
    fn handle(&self, event: Event<K>) -> BoxFuture<'_, Result<(), HandlerError>> {
        futures::future::ready((self.0)(event).map_err(HandlerError::new)).boxed()
    }
}

/// A handler from a synchronous closure.
///
/// ```
/// use durable_informer::informer::{handler_fn, Event};
/// use k8s_openapi::api::core::v1::Pod;
/// let h = handler_fn(|ev: Event<Pod>| -> Result<(), std::convert::Infallible> {
///     println!("{:?}", ev.object().metadata.name);
///     Ok(())
/// });
/// # let _ = h;
/// ```
pub fn handler_fn<K, F, E>(f: F) -> impl EventHandler<K>
where
    K: Send + Sync + 'static,
    F: Fn(Event<K>) -> Result<(), E> + Send + Sync + 'static,
    E: Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
{
    SyncFn(f)
}

struct AsyncFn<F>(F);

impl<K, F, Fut, E> EventHandler<K> for AsyncFn<F>
where
    K: Send + Sync + 'static,
    F: Fn(Event<K>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), E>> + Send + 'static,
    E: Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
{
    fn handle(&self, event: Event<K>) -> BoxFuture<'_, Result<(), HandlerError>> {
        (self.0)(event).map(|r| r.map_err(HandlerError::new)).boxed()
    }
}

/// A handler from an async closure.
pub fn async_handler_fn<K, F, Fut, E>(f: F) -> impl EventHandler<K>
where
    K: Send + Sync + 'static,
    F: Fn(Event<K>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), E>> + Send + 'static,
    E: Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
{
    AsyncFn(f)
}

type AddFn<K> = Box<dyn Fn(Arc<K>, bool) + Send + Sync>;
type UpdateFn<K> = Box<dyn Fn(Arc<K>, Arc<K>) + Send + Sync>;
type DeleteFn<K> = Box<dyn Fn(Arc<K>, bool) + Send + Sync>;

/// client-go's `ResourceEventHandlerFuncs`: optional add, update and delete callbacks.
pub struct HandlerFuncs<K> {
    add: Option<AddFn<K>>,
    update: Option<UpdateFn<K>>,
    delete: Option<DeleteFn<K>>,
}

impl<K> Default for HandlerFuncs<K> {
    fn default() -> Self {
        Self {
            add: None,
            update: None,
            delete: None,
        }
    }
}

impl<K: Send + Sync + 'static> HandlerFuncs<K> {
    /// No callbacks yet.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// `on_add(object, is_in_initial_list)`.
    #[must_use]
    pub fn on_add(mut self, f: impl Fn(Arc<K>, bool) + Send + Sync + 'static) -> Self {
        self.add = Some(Box::new(f));
        self
    }

    /// `on_update(old, new)`.
    #[must_use]
    pub fn on_update(mut self, f: impl Fn(Arc<K>, Arc<K>) + Send + Sync + 'static) -> Self {
        self.update = Some(Box::new(f));
        self
    }

    /// `on_delete(object, final_state_unknown)`.
    #[must_use]
    pub fn on_delete(mut self, f: impl Fn(Arc<K>, bool) + Send + Sync + 'static) -> Self {
        self.delete = Some(Box::new(f));
        self
    }
}

impl<K: Send + Sync + 'static> EventHandler<K> for HandlerFuncs<K> {
    fn handle(&self, event: Event<K>) -> BoxFuture<'_, Result<(), HandlerError>> {
        match event {
            Event::Add { object, initial } => {
                if let Some(f) = &self.add {
                    f(object, initial);
                }
            }
            Event::Update { old, new, .. } => {
                if let Some(f) = &self.update {
                    f(old, new);
                }
            }
            Event::Delete {
                object,
                final_state_unknown,
            } => {
                if let Some(f) = &self.delete {
                    f(object, final_state_unknown);
                }
            }
        }
        futures::future::ready(Ok(())).boxed()
    }
}

/// client-go's `FilteringResourceEventHandler`: passes only objects the filter accepts; an
/// update that makes an object pass becomes an add, one that makes it fail becomes a delete.
pub struct Filtering<K, H> {
    filter: Box<dyn Fn(&K) -> bool + Send + Sync>,
    inner: H,
}

impl<K, H: EventHandler<K>> Filtering<K, H> {
    /// Wraps `inner`.
    pub fn new(filter: impl Fn(&K) -> bool + Send + Sync + 'static, inner: H) -> Self {
        Self {
            filter: Box::new(filter),
            inner,
        }
    }
}

impl<K: Send + Sync + 'static, H: EventHandler<K>> EventHandler<K> for Filtering<K, H> {
    fn handle(&self, event: Event<K>) -> BoxFuture<'_, Result<(), HandlerError>> {
        let pass = |o: &Arc<K>| (self.filter)(o);
        let mapped = match event {
            Event::Add { object, initial } => pass(&object).then_some(Event::Add { object, initial }),
            Event::Update { old, new, resync } => match (pass(&old), pass(&new)) {
                (true, true) => Some(Event::Update { old, new, resync }),
                (false, true) => Some(Event::Add {
                    object: new,
                    initial: false,
                }),
                (true, false) => Some(Event::Delete {
                    object: old,
                    final_state_unknown: false,
                }),
                (false, false) => None,
            },
            Event::Delete {
                object,
                final_state_unknown,
            } => pass(&object).then_some(Event::Delete {
                object,
                final_state_unknown,
            }),
        };
        match mapped {
            Some(ev) => self.inner.handle(ev),
            None => futures::future::ready(Ok(())).boxed(),
        }
    }
}

/// How a handler is registered.
#[derive(Debug, Clone, Default)]
pub struct HandlerOptions {
    pub(crate) name: Option<CursorName>,
    pub(crate) resync: Option<Duration>,
    pub(crate) queued: Option<usize>,
}

impl HandlerOptions {
    /// A volatile handler: it starts with a synthetic add of everything in the store, then
    /// live events (client-go's behaviour for late handlers); nothing survives a restart.
    ///
    /// It is told from the informer's object cache, in client-go's order: the cache (so the
    /// lister) takes a change first, then the handler hears of it. A change of a group that
    /// commits without an fsync is told as soon as the writer has decided it, before the disk
    /// has it; should that group then fail, or its commit be lost, the handler is told of what
    /// stands instead (the restored state, or a delete of an object that never was), so a
    /// handler that keeps its own state ends equal to the store. With
    /// `StoreConfig::fsync_delay(None)` watch events are told once on disk.
    ///
    /// It is told every change, in order, while it is less than [`max_queued`](Self::max_queued)
    /// (16,384) changes behind (they
    /// queue in memory, sharing the cache's objects). Further behind, it is told each changed
    /// object's newest state until it has caught up (like a workqueue: `Update { old, new }`
    /// from the state it was last told to the current one; an object added and deleted
    /// meanwhile is not told at all), and an issue says so: memory stays bounded by the number
    /// of objects, never by how far behind a handler is. Durable handlers
    /// ([`durable`](Self::durable)) are told every logged change, reading the log.
    #[must_use]
    pub fn volatile() -> Self {
        Self::default()
    }

    /// A durable handler: its cursor into the log is persisted under (this informer's scope,
    /// `name`), and after a restart it receives everything committed after that cursor.
    /// Informers of other scopes on the same database may use the same name: each keeps its
    /// own cursor. Delivery is **at least once**: the
    /// cursor is persisted after each batch was handled, so a crash can redeliver the events of
    /// the batch in progress; nothing is lost. A log entry damaged on disk is skipped and
    /// reported ([`HandlerProblem::DamagedLogEntry`](super::HandlerProblem::DamagedLogEntry)),
    /// and what it held is told again as resync updates of the current state. A new durable
    /// handler registered before [`Informer::start`](super::Informer::start) is told every
    /// change of that run one by one, the initial list included (the informer writes nothing
    /// before the handler has its place in the log); one registered later starts from the
    /// store as it is then, as initial adds.
    #[must_use]
    pub fn durable(name: impl Into<CursorName>) -> Self {
        Self {
            name: Some(name.into()),
            resync: None,
            queued: None,
        }
    }

    /// A volatile handler: the most changes queued for it one by one while it is behind
    /// (default 16,384); further behind, it is told each changed object's newest state until
    /// it has caught up. Each queued change costs about a hundred bytes (the objects are the
    /// cache's, shared).
    ///
    /// ```
    /// use durable_informer::informer::HandlerOptions;
    /// let opts = HandlerOptions::volatile().max_queued(1_000);
    /// # let _ = opts;
    /// ```
    #[must_use]
    pub fn max_queued(mut self, changes: usize) -> Self {
        self.queued = Some(changes);
        self
    }

    /// Re-delivers every object as `Update { resync: true }` at this period.
    #[must_use]
    pub fn resync(mut self, period: Duration) -> Self {
        self.resync = Some(period);
        self
    }
}

/// A registered handler. Dropping it does not remove the handler; [`remove`](Self::remove) does.
#[derive(Debug)]
pub struct Registration {
    pub(crate) stop: watch::Sender<bool>,
    pub(crate) synced: watch::Receiver<bool>,
    pub(crate) done: watch::Receiver<bool>,
    pub(crate) cursor: watch::Receiver<crate::store::Seq>,
}

impl Registration {
    /// True once this handler received everything up to the informer's sync point.
    #[must_use]
    pub fn has_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Waits until [`has_synced`](Self::has_synced); fails if the handler stops first (it
    /// was removed, or its informer dropped), never claiming a sync that did not happen.
    pub async fn wait_for_sync(&self) -> Result<(), super::InformerError> {
        let mut rx = self.synced.clone();
        let mut done = self.done.clone();
        tokio::select! {
            r = rx.wait_for(|s| *s) => if r.is_ok() { return Ok(()) },
            _ = done.wait_for(|d| *d) => {}
        }
        if *self.synced.borrow() {
            return Ok(());
        }
        Err(super::InformerError::HandlerStopped)
    }

    /// The log position this handler has handled up to.
    #[must_use]
    pub fn cursor(&self) -> crate::store::Seq {
        *self.cursor.borrow()
    }

    /// Stops delivery; the handler receives nothing more once this returns. A durable handler's
    /// cursor stays in the database.
    pub async fn remove(self) {
        let _ = self.stop.send(true);
        let mut done = self.done.clone();
        let _ = done.wait_for(|d| *d).await;
    }
}
