//! The controller runner: handlers enqueue keys, workers pop them, read the listers, reconcile,
//! and requeue through the rate limiter on error (client-go's controller pattern).
//!
//! It owns the workqueue and the workers; it never touches the store or the network directly —
//! the informers do.
//!
//! ## Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use durable_informer::controller::{Action, Controller};
//! use durable_informer::informer::Informer;
//! use durable_informer::object::ObjectKey;
//! use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
//!
//! # async fn f(deployments: Informer<Deployment>, replicasets: Informer<ReplicaSet>) {
//! struct Ctx;
//! async fn reconcile(key: ObjectKey, _ctx: Arc<Ctx>) -> Result<Action, String> {
//!     println!("reconcile {key}");
//!     Ok(Action::await_change())
//! }
//! let (stop_tx, stop) = tokio::sync::watch::channel(false);
//! Controller::new(deployments)
//!     .owns(replicasets, "Deployment")
//!     .workers(2)
//!     .run(reconcile, Arc::new(Ctx), stop)
//!     .await;
//! # let _ = stop_tx; }
//! ```
//!
//! `run` starts the informers it was given that are not started yet (starting is idempotent, so
//! informers shared through an [`InformerFactory`](crate::informer::InformerFactory) are fine).
//!
//! ## kube-runtime's controller instead
//!
//! [`watcher_stream`](crate::informer::watcher_stream) turns an informer into the
//! `kube::runtime::watcher::Event` stream that `kube::runtime::reflector` and
//! `kube::runtime::Controller::for_stream` consume (kube's `unstable-runtime` feature, enabled by
//! this crate), for code already written against kube-runtime:
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use durable_informer::informer::{watcher_stream, Informer};
//! use futures::StreamExt;
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::runtime::controller::Action;
//! use kube::runtime::{reflector, Controller, WatchStreamExt};
//!
//! async fn reconcile(cm: Arc<ConfigMap>, _ctx: Arc<()>) -> Result<Action, kube::Error> {
//!     println!("reconcile {:?}", cm.metadata.name);
//!     Ok(Action::await_change())
//! }
//! fn error_policy(_cm: Arc<ConfigMap>, _e: &kube::Error, _ctx: Arc<()>) -> Action {
//!     Action::requeue(Duration::from_secs(5))
//! }
//!
//! # async fn f(informer: Informer<ConfigMap>) {
//! informer.start();
//! let (reader, writer) = reflector::store();
//! let stream = reflector(writer, watcher_stream(&informer)).applied_objects();
//! Controller::for_stream(stream, reader)
//!     .run(reconcile, error_policy, Arc::new(()))
//!     .for_each(|_| async {})
//!     .await;
//! # }
//! ```

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use kube::Resource;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::informer::{handler_fn, Event, HandlerOptions, Informer, Registration};
use crate::object::ObjectKey;
use crate::queue::{default_controller_rate_limiter, WorkQueue};

/// What to do after a successful reconcile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Action {
    requeue_after: Option<Duration>,
}

impl Action {
    /// Reconcile again after `delay` even if nothing changes.
    #[must_use]
    pub fn requeue(delay: Duration) -> Self {
        Self {
            requeue_after: Some(delay),
        }
    }

    /// Reconcile again only when something changes.
    #[must_use]
    pub fn await_change() -> Self {
        Self { requeue_after: None }
    }

    /// The requeue delay, if any.
    #[must_use]
    pub fn requeue_after(&self) -> Option<Duration> {
        self.requeue_after
    }
}

/// The key of an object, `namespace/name` or `name`.
#[must_use]
pub fn key_of<K: Resource>(obj: &K) -> Option<ObjectKey> {
    let meta = obj.meta();
    let name = meta.name.clone()?;
    Some(ObjectKey {
        namespace: meta.namespace.clone(),
        name,
    })
}

/// Keys of the owners of `obj` whose kind is `owner_kind` (same namespace, as owner references
/// are namespace-local); the controlling owner only when `controller_only`.
#[must_use]
pub fn owner_keys<K: Resource>(obj: &K, owner_kind: &str, controller_only: bool) -> Vec<ObjectKey> {
    let meta = obj.meta();
    meta.owner_references
        .iter()
        .flatten()
        .filter(|o| o.kind == owner_kind && (!controller_only || o.controller == Some(true)))
        .map(|o| ObjectKey {
            namespace: meta.namespace.clone(),
            name: o.name.clone(),
        })
        .collect()
}

/// Called with the key and the error of a failed reconcile.
type ErrorCallback = Arc<dyn Fn(&ObjectKey, &str) + Send + Sync>;

type Trigger = Box<dyn FnOnce(WorkQueue<ObjectKey>) -> (Registration, BoxFuture<'static, ()>) + Send>;

/// Runs a reconcile function over the keys of a primary informer and of related objects.
pub struct Controller<K> {
    primary: Informer<K>,
    triggers: Vec<Trigger>,
    workers: usize,
    queue: WorkQueue<ObjectKey>,
    on_error: Option<ErrorCallback>,
    leading: Option<watch::Receiver<bool>>,
}

fn enqueue_handler<O, F>(queue: WorkQueue<ObjectKey>, map: F) -> impl crate::informer::EventHandler<O>
where
    O: Send + Sync + 'static,
    F: Fn(&O) -> Vec<ObjectKey> + Send + Sync + 'static,
{
    handler_fn(move |ev: Event<O>| -> Result<(), std::convert::Infallible> {
        match &ev {
            Event::Update { old, new, .. } => {
                // Both: an owner reference may have moved from one owner to another.
                for k in map(old).into_iter().chain(map(new)) {
                    queue.add(k);
                }
            }
            other => {
                for k in map(other.object()) {
                    queue.add(k);
                }
            }
        }
        Ok(())
    })
}

impl<K> Controller<K>
where
    K: Resource + DeserializeOwned + Send + Sync + 'static,
{
    /// A controller for the objects of `primary`, with client-go's default rate limiter
    /// (per-item exponential 5 ms–1000 s, overall 10 qps / burst 100).
    #[must_use]
    pub fn new(primary: Informer<K>) -> Self {
        Self {
            primary,
            triggers: Vec::new(),
            workers: 1,
            queue: WorkQueue::builder()
                .name("controller")
                .rate_limiter(default_controller_rate_limiter())
                .build(),
            on_error: None,
            leading: None,
        }
    }

    /// Also reconciles the owner (of kind `owner_kind`) of every changed object of `informer`.
    #[must_use]
    pub fn owns<C>(self, informer: Informer<C>, owner_kind: &str) -> Self
    where
        C: Resource + DeserializeOwned + Send + Sync + 'static,
    {
        let kind = owner_kind.to_owned();
        self.watches(informer, move |c: &C| owner_keys(c, &kind, true))
    }

    /// Also reconciles the keys `map` gives for every changed object of `informer`.
    #[must_use]
    pub fn watches<C, F>(mut self, informer: Informer<C>, map: F) -> Self
    where
        C: DeserializeOwned + Send + Sync + 'static,
        F: Fn(&C) -> Vec<ObjectKey> + Send + Sync + 'static,
    {
        self.triggers.push(Box::new(move |queue| {
            let reg = informer.add_event_handler(enqueue_handler(queue, map), HandlerOptions::volatile());
            // Idempotent: an informer already started (say, shared through a factory) keeps its
            // one reflector.
            informer.start();
            let wait = async move { informer.wait_for_sync().await };
            (reg, Box::pin(wait))
        }));
        self
    }

    /// Number of concurrent workers (default 1). One key is never reconciled by two workers at
    /// once.
    #[must_use]
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n.max(1);
        self
    }

    /// Called for every failed reconcile (after it was requeued).
    #[must_use]
    pub fn on_error(mut self, f: impl Fn(&ObjectKey, &str) + Send + Sync + 'static) -> Self {
        self.on_error = Some(Arc::new(f));
        self
    }

    /// Reconciles only while `leading` is true, as one replica of several (from
    /// [`LeaderElector::leadership`](crate::leader::LeaderElector::leadership)).
    ///
    /// A follower keeps its informers running and synced and its queue filled (a warm
    /// standby) but reconciles nothing. On winning it enqueues every key of the primary
    /// informer (what the previous leader did is unknown) and starts its workers at once; on
    /// losing, its workers take no new key, and `run` waits for the reconciles in flight.
    /// The elector turns leadership off `lease_duration - renew_deadline` (5 s by default)
    /// before another replica may take the Lease: a reconcile that can run longer than that
    /// should check [`LeaderElector::leadership`](crate::leader::LeaderElector::leadership)
    /// itself.
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// # use durable_informer::controller::{Action, Controller};
    /// # use durable_informer::leader::{KubeLeaseLock, LeaderElectionConfig, LeaderElector};
    /// # use durable_informer::object::ObjectKey;
    /// # async fn f(client: kube::Client, pods: durable_informer::informer::Informer<k8s_openapi::api::core::v1::Pod>) {
    /// # async fn reconcile(_k: ObjectKey, _c: Arc<()>) -> Result<Action, String> { Ok(Action::await_change()) }
    /// let elector = LeaderElector::new(
    ///     KubeLeaseLock::new(client, "default", "my-controller", "replica-a"),
    ///     LeaderElectionConfig::default(),
    /// );
    /// let controller = Controller::new(pods).leader_election(elector.leadership());
    /// let (stop_tx, stop) = tokio::sync::watch::channel(false);
    /// let elector_task = tokio::spawn(elector.run(stop.clone()));
    /// controller.run(reconcile, Arc::new(()), stop).await;
    /// # let _ = (stop_tx, elector_task); }
    /// ```
    #[must_use]
    pub fn leader_election(mut self, leading: watch::Receiver<bool>) -> Self {
        self.leading = Some(leading);
        self
    }

    /// The workqueue (for metrics, or to enqueue keys by hand).
    #[must_use]
    pub fn queue(&self) -> WorkQueue<ObjectKey> {
        self.queue.clone()
    }

    /// Starts the informers (those not started yet), waits for their caches to sync, runs the
    /// workers until `stop` turns true, then shuts down gracefully: events are no longer
    /// enqueued, keys already queued are still reconciled, and `run` returns once every
    /// reconcile in flight has finished (delayed requeues are dropped).
    ///
    /// A reconcile that panics is handled like one that fails: the panic is logged with the key,
    /// passed to [`on_error`](Self::on_error) and the key is requeued through the rate limiter.
    /// The worker lives on. As with any caught panic, state the reconcile shared through `ctx`
    /// may be left half-updated.
    pub async fn run<Ctx, F, Fut, E>(self, reconcile: F, ctx: Arc<Ctx>, mut stop: watch::Receiver<bool>)
    where
        Ctx: Send + Sync + 'static,
        F: Fn(ObjectKey, Arc<Ctx>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        E: std::fmt::Display + Send + 'static,
    {
        let queue = self.queue.clone();
        let mut regs = Vec::new();
        let mut waits: Vec<BoxFuture<'static, ()>> = Vec::new();
        let primary = self.primary.clone();
        regs.push(primary.add_event_handler(
            enqueue_handler(queue.clone(), |k: &K| key_of(k).into_iter().collect()),
            HandlerOptions::volatile(),
        ));
        primary.start();
        for t in self.triggers {
            let (reg, wait) = t(queue.clone());
            regs.push(reg);
            waits.push(wait);
        }
        // Wait for every cache before the first reconcile (WaitForCacheSync).
        let all_synced = async {
            primary.wait_for_sync().await;
            for w in waits {
                w.await;
            }
            for r in &regs {
                r.wait_for_sync().await;
            }
        };
        let stopped = tokio::select! {
            () = all_synced => false,
            r = stop.wait_for(|s| *s) => r.is_ok(),
        };
        if stopped {
            for r in regs {
                r.remove().await;
            }
            return;
        }
        let workers = Workers {
            queue: queue.clone(),
            reconcile: Arc::new(reconcile),
            ctx,
            on_error: self.on_error.clone(),
        };
        let handles = match self.leading {
            None => {
                tracing::info!(workers = self.workers, "caches synced; starting workers");
                let handles = workers.spawn(self.workers, None);
                let _ = stop.wait_for(|s| *s).await;
                handles
            }
            Some(leading) => lead_while(&primary, &workers, self.workers, leading, &mut stop).await,
        };
        for r in regs {
            r.remove().await;
        }
        drain(&queue, handles).await;
    }
}

/// Waits until `leading` is true; false once its elector is gone (a dropped sender keeps its
/// last value, which must not count as leadership).
async fn until_leading(leading: &mut watch::Receiver<bool>) -> bool {
    loop {
        if leading.has_changed().is_err() {
            return false;
        }
        if *leading.borrow_and_update() {
            return true;
        }
        if leading.changed().await.is_err() {
            return false;
        }
    }
}

/// Runs the workers only while `leading` is true, until `stop`; returns the workers still
/// running then (none when stopped as a follower).
async fn lead_while<K, Ctx, F, Fut, E>(
    primary: &Informer<K>,
    workers: &Workers<Ctx, F>,
    n: usize,
    mut leading: watch::Receiver<bool>,
    stop: &mut watch::Receiver<bool>,
) -> Vec<JoinHandle<()>>
where
    K: DeserializeOwned + Send + Sync + 'static,
    Ctx: Send + Sync + 'static,
    F: Fn(ObjectKey, Arc<Ctx>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    loop {
        tracing::info!("caches synced; waiting for leadership");
        let won = tokio::select! {
            won = until_leading(&mut leading) => won,
            _ = stop.wait_for(|s| *s) => return Vec::new(),
        };
        if !won {
            // The elector is gone: this replica can never lead again.
            let _ = stop.wait_for(|s| *s).await;
            return Vec::new();
        }
        // What the previous leader reconciled is unknown: every key once more.
        let store = primary.store();
        match tokio::task::spawn_blocking(move || store.list_keys()).await {
            Ok(Ok(keys)) => keys.into_iter().for_each(|k| workers.queue.add(k)),
            Ok(Err(e)) => tracing::warn!(error = %e, "listing the keys to reconcile after winning failed"),
            Err(e) => tracing::warn!(error = %e, "listing the keys to reconcile after winning failed"),
        }
        tracing::info!(workers = n, "leading; starting workers");
        let handles = workers.spawn(n, Some(leading.clone()));
        // Decided first: a `watch::Ref` must not live across the awaits below.
        let lost = tokio::select! {
            // Lost, or the elector is gone (then leadership cannot be vouched for either).
            r = leading.wait_for(|l| !*l) => { drop(r); true }
            _ = stop.wait_for(|s| *s) => false,
        };
        if !lost {
            return handles;
        }
        tracing::warn!("leadership lost; stopping workers");
        for h in handles {
            if let Err(e) = h.await {
                tracing::error!(error = %e, "controller worker failed");
            }
        }
    }
}

/// What every worker of one controller shares.
struct Workers<Ctx, F> {
    queue: WorkQueue<ObjectKey>,
    reconcile: Arc<F>,
    ctx: Arc<Ctx>,
    on_error: Option<ErrorCallback>,
}

impl<Ctx, F> Clone for Workers<Ctx, F> {
    fn clone(&self) -> Self {
        Self {
            queue: self.queue.clone(),
            reconcile: self.reconcile.clone(),
            ctx: self.ctx.clone(),
            on_error: self.on_error.clone(),
        }
    }
}

impl<Ctx, F, Fut, E> Workers<Ctx, F>
where
    Ctx: Send + Sync + 'static,
    F: Fn(ObjectKey, Arc<Ctx>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    /// Spawns `n` worker tasks; each ends when the queue is shut down and empty, or, with
    /// `leading`, once it turns false (after the reconcile in flight).
    fn spawn(&self, n: usize, leading: Option<watch::Receiver<bool>>) -> Vec<JoinHandle<()>> {
        (0..n)
            .map(|_| {
                let w = self.clone();
                let mut leading = leading.clone();
                tokio::spawn(async move {
                    loop {
                        let next = match &mut leading {
                            // `get` is cancel safe: losing leadership takes no key.
                            Some(l) => tokio::select! {
                                biased;
                                _ = l.wait_for(|l| !*l) => None,
                                key = w.queue.get() => key,
                            },
                            None => w.queue.get().await,
                        };
                        let Some(key) = next else { break };
                        // `done` always, even if the error callback panics: otherwise the key is
                        // never handed out again and a drain waits for it forever.
                        let _done = DoneOnDrop(&w.queue, &key);
                        w.process(&key).await;
                    }
                })
            })
            .collect()
    }

    /// Reconciles `key` once and schedules what comes next.
    async fn process(&self, key: &ObjectKey) {
        let (reconcile, ctx) = (self.reconcile.clone(), self.ctx.clone());
        let k = key.clone();
        // Inside the async block, so that a panic in the call itself is caught too.
        let result = AssertUnwindSafe(async move { reconcile(k, ctx).await })
            .catch_unwind()
            .await;
        let msg = match result {
            Ok(Ok(action)) => {
                self.queue.forget(key);
                if let Some(d) = action.requeue_after {
                    self.queue.add_after(key.clone(), d);
                }
                return;
            }
            Ok(Err(e)) => e.to_string(),
            Err(panic) => format!("reconcile panicked: {}", panic_message(panic.as_ref())),
        };
        tracing::warn!(%key, error = %msg, requeues = self.queue.num_requeues(key), "reconcile failed");
        self.queue.add_rate_limited(key.clone());
        if let Some(f) = &self.on_error {
            f(key, &msg);
        }
    }
}

/// Marks its key done when dropped.
struct DoneOnDrop<'a>(&'a WorkQueue<ObjectKey>, &'a ObjectKey);

impl Drop for DoneOnDrop<'_> {
    fn drop(&mut self) {
        self.0.done(self.1);
    }
}

/// The text a panic was raised with, if it is a string.
fn panic_message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

/// Shuts `queue` down with drain and waits for the workers: queued keys are still handed out,
/// and every reconcile in flight finishes.
async fn drain(queue: &WorkQueue<ObjectKey>, workers: Vec<JoinHandle<()>>) {
    queue.shutdown_with_drain().await;
    for w in workers {
        if let Err(e) = w.await {
            // Reconcile panics are caught; this is a panic in the queue or the error callback.
            tracing::error!(error = %e, "controller worker failed");
        }
    }
}

#[cfg(test)]
mod tests {
    //! The worker loop on paused time, without informers: keys are added to the queue by hand.

    use std::collections::{HashMap, HashSet};
    use std::sync::Mutex;

    use tokio::time::Instant;

    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn key(name: &str) -> ObjectKey {
        ObjectKey {
            namespace: Some("ns".into()),
            name: name.into(),
        }
    }

    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// What the test reconcilers record: every call with its (virtual) time.
    #[derive(Default)]
    struct Log {
        calls: Mutex<Vec<(String, Instant)>>,
        errors: Mutex<Vec<(String, String)>>,
    }

    impl Log {
        fn times(&self, name: &str) -> Vec<Instant> {
            lock(&self.calls)
                .iter()
                .filter(|(n, _)| n == name)
                .map(|(_, t)| *t)
                .collect()
        }

        fn gaps(&self, name: &str) -> Vec<Duration> {
            self.times(name).windows(2).map(|w| w[1] - w[0]).collect()
        }
    }

    /// Workers over a fresh controller queue (client-go's default limiter), reporting errors to
    /// the log.
    fn workers<F, Fut>(log: &Arc<Log>, reconcile: F) -> Workers<Log, F>
    where
        F: Fn(ObjectKey, Arc<Log>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, String>> + Send + 'static,
    {
        let errors = log.clone();
        Workers {
            queue: WorkQueue::builder()
                .rate_limiter(default_controller_rate_limiter())
                .build(),
            reconcile: Arc::new(reconcile),
            ctx: log.clone(),
            on_error: Some(Arc::new(move |k: &ObjectKey, e: &str| {
                lock(&errors.errors).push((k.name.clone(), e.to_owned()));
            })),
        }
    }

    /// Records the call and returns how many calls `key` had before this one.
    fn record(log: &Log, key: &ObjectKey) -> usize {
        let mut calls = lock(&log.calls);
        let before = calls.iter().filter(|(n, _)| *n == key.name).count();
        calls.push((key.name.clone(), Instant::now()));
        before
    }

    #[tokio::test(start_paused = true)]
    async fn requeue_after_reconciles_again_after_the_delay() {
        let log = Arc::new(Log::default());
        let w = workers(&log, |k, log: Arc<Log>| async move {
            let n = record(&log, &k);
            Ok(if n == 0 {
                Action::requeue(Duration::from_secs(10))
            } else {
                Action::await_change()
            })
        });
        let handles = w.spawn(1, None);
        w.queue.add(key("a"));
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert_eq!(log.times("a").len(), 1, "not before the delay");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(log.gaps("a"), [Duration::from_secs(10)]);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(log.times("a").len(), 2, "await_change: no third call");
        drain(&w.queue, handles).await;
    }

    #[tokio::test(start_paused = true)]
    async fn errors_back_off_per_key_and_success_resets_the_backoff() {
        let log = Arc::new(Log::default());
        // "a" fails 3 times, then succeeds; later, when re-added, fails once more.
        // "b" fails once, then succeeds.
        let w = workers(&log, |k, log: Arc<Log>| async move {
            let n = record(&log, &k);
            let fails = match k.name.as_str() {
                "a" => n < 3 || n == 4,
                _ => n < 1,
            };
            if fails {
                Err(format!("failure {n}"))
            } else {
                Ok(Action::await_change())
            }
        });
        let handles = w.spawn(2, None);
        w.queue.add(key("a"));
        tokio::time::sleep(MS * 2).await;
        w.queue.add(key("b"));
        tokio::time::sleep(MS).await;
        assert_eq!(w.queue.num_requeues(&key("a")), 1);
        assert_eq!(w.queue.num_requeues(&key("b")), 1);
        tokio::time::sleep(Duration::from_secs(1)).await;
        // 5 ms, 10 ms, 20 ms: client-go's per-item exponential limiter; b's own history.
        assert_eq!(log.gaps("a"), [MS * 5, MS * 10, MS * 20]);
        assert_eq!(log.gaps("b"), [MS * 5]);
        assert_eq!(w.queue.num_requeues(&key("a")), 0, "forgotten after the success");
        assert_eq!(w.queue.metrics().retries, 4);
        let errors = lock(&log.errors).clone();
        assert_eq!(errors.len(), 4);
        assert!(errors.contains(&("a".into(), "failure 2".into())));

        // A later failure starts from the base delay again.
        w.queue.add(key("a"));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(log.gaps("a")[4..], [MS * 5]);
        drain(&w.queue, handles).await;
    }

    #[tokio::test(start_paused = true)]
    async fn workers_run_concurrently_but_never_one_key_twice_at_once() {
        #[derive(Default)]
        struct Track {
            in_flight: HashSet<String>,
            peak: usize,
            overlap: Vec<String>,
            done: HashMap<String, usize>,
        }
        let track = Arc::new(Mutex::new(Track::default()));
        let log = Arc::new(Log::default());
        let t = track.clone();
        let w = workers(&log, move |k, _log| {
            let t = t.clone();
            async move {
                {
                    let mut t = lock(&t);
                    if !t.in_flight.insert(k.name.clone()) {
                        t.overlap.push(k.name.clone());
                    }
                    t.peak = t.peak.max(t.in_flight.len());
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                let mut t = lock(&t);
                t.in_flight.remove(&k.name);
                *t.done.entry(k.name.clone()).or_default() += 1;
                Ok(Action::await_change())
            }
        });
        let handles = w.spawn(4, None);
        for round in 0..3 {
            // Every key again while the previous round may still be in flight.
            for i in 0..20 {
                w.queue.add(key(&format!("k{i}")));
            }
            tokio::time::sleep(MS * 300 * round).await;
        }
        tokio::time::sleep(Duration::from_secs(60)).await;
        drain(&w.queue, handles).await;
        let t = lock(&track);
        assert_eq!(t.peak, 4, "4 workers, 20 keys: 4 at once");
        assert!(t.overlap.is_empty(), "reconciled twice at once: {:?}", t.overlap);
        assert_eq!(t.done.len(), 20);
        assert!(t.done.values().all(|n| *n >= 1));
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_waits_for_reconciles_in_flight_and_hands_out_queued_keys() {
        let log = Arc::new(Log::default());
        let finished = Arc::new(Mutex::new(Vec::<String>::new()));
        let f = finished.clone();
        let w = workers(&log, move |k, log: Arc<Log>| {
            let f = f.clone();
            async move {
                record(&log, &k);
                tokio::time::sleep(Duration::from_secs(5)).await;
                lock(&f).push(k.name.clone());
                Ok(Action::requeue(Duration::from_secs(1)))
            }
        });
        let handles = w.spawn(1, None);
        w.queue.add(key("a"));
        w.queue.add(key("b"));
        tokio::time::sleep(Duration::from_secs(1)).await;
        let stopping = tokio::spawn({
            let queue = w.queue.clone();
            async move { drain(&queue, handles).await }
        });
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(!stopping.is_finished(), "a is still reconciling");
        assert!(lock(&finished).is_empty());
        assert!(stopping.await.is_ok());
        assert_eq!(
            *lock(&finished),
            ["a", "b"],
            "a finished; b, queued, was still handed out"
        );
        assert_eq!(log.times("a").len(), 1, "the requeue after 1 s is dropped");
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_reconcile_is_retried_and_does_not_stall_the_worker_or_shutdown() {
        let log = Arc::new(Log::default());
        let w = workers(&log, |k, log: Arc<Log>| async move {
            let n = record(&log, &k);
            assert!(!(k.name == "a" && n == 0), "first reconcile of a");
            Ok(Action::await_change())
        });
        // One worker: if the panic killed it, nothing after it would be reconciled.
        let handles = w.spawn(1, None);
        w.queue.add(key("a"));
        w.queue.add(key("b"));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(log.times("a").len(), 2, "retried");
        assert_eq!(log.gaps("a"), [MS * 5], "through the rate limiter");
        assert_eq!(log.times("b").len(), 1);
        assert_eq!(w.queue.num_requeues(&key("a")), 0, "the retry succeeded");
        let errors = lock(&log.errors).clone();
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].0, "a");
        assert!(
            errors[0].1.contains("panicked") && errors[0].1.contains("first reconcile of a"),
            "{errors:?}"
        );
        let stopped = tokio::time::timeout(Duration::from_secs(60), drain(&w.queue, handles)).await;
        assert!(stopped.is_ok(), "shutdown completes");
    }

    #[tokio::test(start_paused = true)]
    async fn a_panic_in_the_call_itself_is_caught_too() {
        let log = Arc::new(Log::default());
        let calls = Arc::new(Mutex::new(0_u32));
        let c = calls.clone();
        let w = workers(&log, move |_k, _log| {
            let n = {
                let mut n = lock(&c);
                *n += 1;
                *n
            };
            assert_ne!(n, 1, "before the future");
            async { Ok(Action::await_change()) }
        });
        let handles = w.spawn(1, None);
        w.queue.add(key("a"));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(*lock(&calls), 2);
        assert_eq!(lock(&log.errors).len(), 1);
        drain(&w.queue, handles).await;
    }
}
