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
//! use durable_informer::store::ObjectKey;
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

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use kube::Resource;
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use crate::informer::{handler_fn, Event, HandlerOptions, Informer, Registration};
use crate::queue::{default_controller_rate_limiter, WorkQueue};
use crate::store::ObjectKey;

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

    /// The workqueue (for metrics, or to enqueue keys by hand).
    #[must_use]
    pub fn queue(&self) -> WorkQueue<ObjectKey> {
        self.queue.clone()
    }

    /// Starts the informers (if not started), waits for their caches to sync, runs the workers
    /// until `stop` turns true, then drains: items being processed finish, nothing new starts.
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
        for t in self.triggers {
            let (reg, wait) = t(queue.clone());
            regs.push(reg);
            waits.push(wait);
        }
        primary.start();
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
        tracing::info!(workers = self.workers, "caches synced; starting workers");
        let reconcile = Arc::new(reconcile);
        let mut workers = Vec::new();
        for _ in 0..self.workers {
            let queue = queue.clone();
            let reconcile = reconcile.clone();
            let ctx = ctx.clone();
            let on_error = self.on_error.clone();
            workers.push(tokio::spawn(async move {
                while let Some(key) = queue.get().await {
                    let result = reconcile(key.clone(), ctx.clone()).await;
                    match result {
                        Ok(action) => {
                            queue.forget(&key);
                            if let Some(d) = action.requeue_after {
                                queue.add_after(key.clone(), d);
                            }
                        }
                        Err(e) => {
                            let msg = e.to_string();
                            tracing::warn!(%key, error = %msg, requeues = queue.num_requeues(&key), "reconcile failed");
                            queue.add_rate_limited(key.clone());
                            if let Some(f) = &on_error {
                                f(&key, &msg);
                            }
                        }
                    }
                    queue.done(&key);
                }
            }));
        }
        let _ = stop.wait_for(|s| *s).await;
        for r in regs {
            r.remove().await;
        }
        queue.shutdown_with_drain().await;
        for w in workers {
            let _ = w.await;
        }
    }
}
