//! The reflector: lists and watches a [`Source`] into the durable store.
//!
//! It owns the protocol, never redb: every change goes to the store's [`Writer`], and a
//! resourceVersion counts as persisted only after the writer acknowledged the durable commit.
//!
//! ```text
//!            ┌────────── persisted RV, synced ──────────┐
//!  start ────┤                                          ▼
//!            └─ none ─▶ List ──▶ Watch(rv) ◀──▶ Resume probe (one limit=1 LIST)
//!                        ▲         │  ended: re-watch from the persisted RV
//!                        │         │  429/5xx/I/O/stall/malformed: backoff, re-watch
//!                        └─────────┘  410 Gone / 504 too-large RV / RV regression: relist as a diff
//! ```
//!
//! A resume makes no full LIST: the watch starts from the persisted RV and the scope reports
//! synced once its committed RV reaches the server's current RV, read by one `limit=1` LIST.
//! A relist is staged in the database and swapped in with one transaction; handlers see only
//! the differences, including the deletes that happened while nobody watched.

mod backoff;
mod transform;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use rand::Rng;
use tokio::sync::{oneshot, watch};
use tracing::Instrument;

pub use backoff::BackoffConfig;
pub use transform::{strip_managed_fields, tombstone, OversizePolicy, Transform, TransformError, TransformFn};

use crate::metrics;
use crate::object::{RawObject, ResourceVersion};
use crate::source::{ListRequest, Source, SourceError, WatchEvent, WatchRequest};
use crate::store::{Batch, Committed, DeltaKind, ScopeId, Store, StoreError, Writer};
use backoff::Backoff;
use prometheus_client::metrics::histogram::Histogram;

/// Reflector settings. `Default` gives client-go's behaviour.
#[derive(Debug, Clone)]
pub struct ReflectorConfig {
    /// LIST page size (default 500).
    pub page_size: u32,
    /// Try a streaming list (`sendInitialEvents`) first, falling back to a paginated LIST on
    /// 422 or any error (default true).
    pub streaming_list: bool,
    /// `timeoutSeconds` of each watch, picked at random in this range (default 5–10 minutes).
    pub watch_timeout: (Duration, Duration),
    /// A watch that delivers nothing (not even a bookmark) for longer than its timeout plus this
    /// is considered stalled and reopened (default 30 s).
    pub stall_grace: Duration,
    /// Backoff after errors.
    pub backoff: BackoffConfig,
    /// Transforms before persisting.
    pub transform: Transform,
    /// Most deltas per batch handed to the writer (default 1000).
    pub max_batch: usize,
    /// Wipe the database instead of failing when it belongs to another cluster (default false).
    pub reset_on_cluster_change: bool,
    /// After a resume, the scope counts as synced when its committed RV reaches the server's
    /// RV (read by the one-object probe), or at the first bookmark — or, with this set, once the
    /// resumed watch has delivered its backlog and stayed quiet this long (default 2 s). The
    /// server sends every event after the resumed RV as soon as the watch opens, so a quiet
    /// watch means nothing was missed; without it a scope whose objects did not change waits for
    /// the next bookmark (about a minute on a real server). `None` disables it.
    ///
    /// This rule is ours, not the API server's: it assumes the server delivers the backlog
    /// promptly. A server whose watch cache lags (kubernetes#107133) may stay quiet longer and
    /// then send old changes, so `synced` can come early; nothing is lost (those events are
    /// applied when they arrive), only the signal is optimistic. Use `None` for the strict rule
    /// (the probe RV or a bookmark).
    pub resume_quiet_period: Option<Duration>,
}

impl Default for ReflectorConfig {
    fn default() -> Self {
        Self {
            page_size: 500,
            streaming_list: true,
            watch_timeout: (Duration::from_secs(300), Duration::from_secs(600)),
            stall_grace: Duration::from_secs(30),
            backoff: BackoffConfig::default(),
            transform: Transform::default(),
            max_batch: 1000,
            reset_on_cluster_change: false,
            resume_quiet_period: Some(Duration::from_secs(2)),
        }
    }
}

/// Errors of the reflector. Each names the resource, the RV and what the server said.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ReflectorError {
    /// Talking to the server failed.
    #[error("{source} (resourceVersion {rv:?}{})", continue_token.as_ref().map(|t| format!(", continue {t:?}")).unwrap_or_default())]
    Source {
        /// The failure.
        #[source]
        source: SourceError,
        /// The RV the request was made from (for a LIST page after the first, the list's RV;
        /// `""` is a consistent read of the current state).
        rv: String,
        /// The continue token of a LIST page after the first.
        continue_token: Option<String>,
    },
    /// The store refused or failed a write.
    #[error("{resource}: store: {source}")]
    Store {
        /// The resource.
        resource: String,
        /// What the store said (shared: the error is cloned into the status and every report).
        #[source]
        source: Arc<StoreError>,
    },
    /// A paginated LIST kept expiring (410 on its continue token) and was given up.
    #[error("{resource}: list restarted {restarts} times; the last: {source}")]
    ListRestarts {
        /// The resource.
        resource: String,
        /// How many times the list started over.
        restarts: u32,
        /// The last page's failure.
        #[source]
        source: SourceError,
    },
    /// An object was not stored (a stored older version of it is deleted).
    #[error("{resource}: {source} (resourceVersion {rv:?})")]
    Transform {
        /// The resource.
        resource: String,
        /// Why.
        #[source]
        source: TransformError,
        /// The object's RV.
        rv: String,
    },
    /// The database belongs to another cluster (fatal: the reflector stops).
    #[error(transparent)]
    ClusterMismatch(Arc<StoreError>),
}

/// Where the reflector is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Phase {
    /// Not started.
    #[default]
    Starting,
    /// Listing (initial list or relist).
    Listing,
    /// Probing the server's RV before resuming.
    Probing,
    /// Watching.
    Watching,
    /// Waiting after an error.
    Backoff,
    /// Stopped.
    Stopped,
}

/// What the reflector reports about itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReflectorStatus {
    /// The phase.
    pub phase: Phase,
    /// The store holds a complete, current view (initial list done, or resume caught up).
    pub synced: bool,
    /// The store was restored from disk at start (no initial LIST was needed).
    pub restored: bool,
    /// The last durably committed RV.
    pub committed_rv: Option<ResourceVersion>,
    /// Full lists made (initial + relists).
    pub lists: u64,
    /// Relists (after the first list) and why the last one ran.
    pub relists: u64,
    /// Why the last list ran.
    pub last_list_reason: Option<String>,
    /// Watches opened.
    pub watches: u64,
    /// Events persisted.
    pub events: u64,
    /// The last error, if any.
    pub last_error: Option<String>,
}

/// A callback for every error the reflector meets (it also logs them and keeps the last one in
/// its status).
pub type ErrorHook = Arc<dyn Fn(&ReflectorError) + Send + Sync>;

/// The reflector of one scope.
pub struct Reflector<S: Source> {
    source: S,
    writer: Writer,
    store: Store,
    config: ReflectorConfig,
    status: watch::Sender<ReflectorStatus>,
    on_error: Option<ErrorHook>,
    streaming_unsupported: bool,
    backoff: Backoff,
    /// Batches commit without an fsync (see [`Reflector::relaxed_commits`]).
    relaxed: bool,
}

enum Next {
    List(String),
    Resume(ResourceVersion),
    Watch(ResourceVersion),
}

enum WatchEnd {
    /// The stream ended normally: re-watch.
    Ended,
    /// 410: relist.
    Gone(String),
    /// 504 too-large RV: relist from "".
    TooLarge(String),
    /// Retry after a backoff (with a Retry-After hint).
    Retry(Option<Duration>),
    /// Stop was requested.
    Stop,
}

impl<S: Source> Reflector<S> {
    /// A reflector writing `source` into `scope` of the database behind `writer`/`store`.
    #[must_use]
    pub fn new(source: S, writer: Writer, store: Store, config: ReflectorConfig) -> Self {
        let backoff = Backoff::new(config.backoff);
        let (status, _) = watch::channel(ReflectorStatus::default());
        Self {
            source,
            writer,
            store,
            config,
            status,
            on_error: None,
            streaming_unsupported: false,
            backoff,
            relaxed: false,
        }
    }

    /// Commits every batch without waiting for the disk: for a bulk load (a replay into a new
    /// scope) that makes its end durable with [`Writer::flush`] and is redone from the start
    /// after a crash. A crash still leaves the database at some committed state (invariant 1),
    /// only an older one.
    #[must_use]
    pub(crate) fn relaxed_commits(mut self) -> Self {
        self.relaxed = true;
        self
    }

    fn new_batch(&self) -> Batch {
        let mut batch = Batch::new(self.scope());
        batch.relaxed = self.relaxed;
        batch
    }

    /// Calls `hook` for every error.
    #[must_use]
    pub fn on_error(mut self, hook: ErrorHook) -> Self {
        self.on_error = Some(hook);
        self
    }

    /// The reflector's status, updated as it goes.
    #[must_use]
    pub fn status(&self) -> watch::Receiver<ReflectorStatus> {
        self.status.subscribe()
    }

    fn scope(&self) -> ScopeId {
        self.store.scope()
    }

    fn labels(&self) -> metrics::ResourceLabels {
        metrics::ResourceLabels {
            resource: self.source.resource(),
        }
    }

    fn report(&self, err: &ReflectorError) {
        tracing::warn!(scope = %self.scope(), error = %err, "reflector");
        self.status.send_modify(|s| s.last_error = Some(err.to_string()));
        if let Some(h) = &self.on_error {
            h(err);
        }
    }

    fn store_err(&self, e: StoreError) -> ReflectorError {
        ReflectorError::Store {
            resource: self.source.resource(),
            source: Arc::new(e),
        }
    }

    fn phase(&self, phase: Phase) {
        self.status.send_modify(|s| s.phase = phase);
    }

    /// Waits `delay` unless stop is requested first; returns false on stop.
    async fn sleep(&self, delay: Duration, stop: &mut watch::Receiver<bool>) -> bool {
        self.phase(Phase::Backoff);
        tokio::select! {
            () = tokio::time::sleep(delay) => true,
            _ = stop.wait_for(|s| *s) => false,
        }
    }

    /// Runs until `stop` turns true (or is dropped), or a fatal error. Cancelling the future is
    /// also safe: every commit is atomic, and an unacknowledged batch is at most redelivered.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) -> Result<(), ReflectorError> {
        let result = self.run_inner(&mut stop).await;
        self.phase(Phase::Stopped);
        result
    }

    async fn run_inner(&mut self, stop: &mut watch::Receiver<bool>) -> Result<(), ReflectorError> {
        self.check_identity(stop).await?;
        let record = match self.store.record() {
            Ok(r) => r,
            Err(e) => {
                let err = self.store_err(e);
                self.report(&err);
                return Err(err);
            }
        };
        let mut next = match record.rv.clone() {
            Some(rv) if record.synced => {
                self.status.send_modify(|s| {
                    s.restored = true;
                    s.committed_rv = Some(rv.clone());
                });
                Next::Resume(rv)
            }
            _ => Next::List("initial list".to_owned()),
        };
        let mut sync_target: Option<ResourceVersion> = None;
        loop {
            if *stop.borrow() {
                return Ok(());
            }
            next = match next {
                Next::Resume(rv) => {
                    self.phase(Phase::Probing);
                    match self.probe().await {
                        Ok(server_rv) if server_rv.is_older_than(&rv) => {
                            // etcd restored from an older backup (kubernetes#107457): a watch
                            // from our RV would be silently empty.
                            Next::List(format!(
                                "persisted resourceVersion {rv} is ahead of the server's {server_rv} (cluster restored from a backup?)"
                            ))
                        }
                        Ok(server_rv) => {
                            sync_target = Some(server_rv);
                            self.mark_synced_if_caught_up(&rv, &sync_target, false);
                            Next::Watch(rv)
                        }
                        Err(e) => {
                            let hint = e.status().and_then(|s| s.retry_after);
                            self.report(&ReflectorError::Source {
                                source: e,
                                rv: String::new(),
                                continue_token: None,
                            });
                            let delay = self.backoff.delay(hint);
                            if !self.sleep(delay, stop).await {
                                return Ok(());
                            }
                            Next::Resume(rv)
                        }
                    }
                }
                Next::List(reason) => {
                    self.phase(Phase::Listing);
                    match self.list_all(&reason, stop).await {
                        Ok(Some(rv)) => {
                            sync_target = None;
                            self.status.send_modify(|s| {
                                s.synced = true;
                                s.committed_rv = Some(rv.clone());
                            });
                            Next::Watch(rv)
                        }
                        Ok(None) => return Ok(()),
                        Err((err, hint)) => {
                            self.report(&err);
                            let delay = self.backoff.delay(hint);
                            if !self.sleep(delay, stop).await {
                                return Ok(());
                            }
                            Next::List(reason)
                        }
                    }
                }
                Next::Watch(rv) => {
                    self.phase(Phase::Watching);
                    let end = self.watch_once(rv.clone(), &sync_target, stop).await;
                    // Always continue from what is durably persisted, which may be ahead of
                    // what this loop saw acknowledged (a commit reported failed may be durable).
                    let Some(persisted) = self.persisted_rv(rv, stop).await else {
                        return Ok(());
                    };
                    match end {
                        WatchEnd::Stop => return Ok(()),
                        WatchEnd::Ended => Next::Watch(persisted),
                        WatchEnd::Gone(msg) => Next::List(format!("410 Gone: {msg}")),
                        WatchEnd::TooLarge(msg) => Next::List(format!(
                            "504 too large resourceVersion {persisted} (cluster rebuilt or restored?): {msg}"
                        )),
                        WatchEnd::Retry(hint) => {
                            let delay = self.backoff.delay(hint);
                            if !self.sleep(delay, stop).await {
                                return Ok(());
                            }
                            Next::Watch(persisted)
                        }
                    }
                }
            };
        }
    }

    async fn check_identity(&mut self, stop: &mut watch::Receiver<bool>) -> Result<(), ReflectorError> {
        let identity = loop {
            match self.source.cluster_identity().await {
                Ok(id) => break id,
                Err(e) => {
                    let hint = e.status().and_then(|s| s.retry_after);
                    self.report(&ReflectorError::Source {
                        source: e,
                        rv: String::new(),
                        continue_token: None,
                    });
                    let delay = self.backoff.delay(hint);
                    if !self.sleep(delay, stop).await {
                        return Ok(());
                    }
                }
            }
        };
        let Some(identity) = identity else { return Ok(()) };
        match self
            .writer
            .cluster_identity(&identity, self.config.reset_on_cluster_change)
            .await
        {
            Ok(wiped) => {
                if wiped {
                    tracing::warn!(%identity, "database belonged to another cluster and was reset");
                }
                Ok(())
            }
            Err(e @ StoreError::ClusterMismatch { .. }) => {
                let err = ReflectorError::ClusterMismatch(Arc::new(e));
                self.report(&err);
                Err(err)
            }
            Err(e) => {
                let err = self.store_err(e);
                self.report(&err);
                Err(err)
            }
        }
    }

    /// The server's current RV, from a one-object LIST.
    async fn probe(&self) -> Result<ResourceVersion, SourceError> {
        metrics::global().list_requests.get_or_create(&self.labels()).inc();
        let page = self
            .source
            .list(ListRequest {
                limit: Some(1),
                ..ListRequest::default()
            })
            .await?;
        Ok(page.resource_version)
    }

    fn mark_synced_if_caught_up(
        &self,
        committed: &ResourceVersion,
        target: &Option<ResourceVersion>,
        progressed: bool,
    ) {
        let caught_up = match target {
            None => false,
            Some(t) => match (committed.as_u64(), t.as_u64()) {
                (Some(c), Some(t)) => c >= t,
                // Not comparable: the first event or bookmark after the probe.
                _ => progressed,
            },
        };
        if caught_up {
            self.status.send_if_modified(|s| {
                let changed = !s.synced;
                s.synced = true;
                changed
            });
        }
    }

    /// The transform of a watched object: the object to store, or the tombstone of a refused
    /// one (`Refused(None)` only when even its identity cannot be read, which the source rules
    /// out).
    fn transform_watched(&self, obj: RawObject) -> Watched {
        let original = obj.bytes.clone();
        match self.transform(obj) {
            Some(o) => Watched::Keep(o),
            None => Watched::Refused(transform::tombstone(&original)),
        }
    }

    fn transform(&self, obj: RawObject) -> Option<RawObject> {
        // Cheap (the Arc of the bytes); the RV is read from them again only for an error.
        let original = obj.bytes.clone();
        match self.config.transform.apply(obj) {
            Ok(o) => o,
            Err(e) => {
                let rv = crate::object::extract_meta(&original)
                    .map(|m| m.resource_version.0)
                    .unwrap_or_default();
                let err = ReflectorError::Transform {
                    resource: self.source.resource(),
                    source: e,
                    rv,
                };
                match self.config.transform.oversize {
                    OversizePolicy::Skip
                        if matches!(
                            err,
                            ReflectorError::Transform {
                                source: TransformError::TooLarge { .. },
                                ..
                            }
                        ) =>
                    {
                        tracing::warn!(error = %err, "skipped");
                    }
                    _ => self.report(&err),
                }
                None
            }
        }
    }

    /// A full list into the store. Returns the list RV, or `None` when stopped.
    async fn list_all(
        &mut self,
        reason: &str,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<Option<ResourceVersion>, (ReflectorError, Option<Duration>)> {
        let record = self.store.record().map_err(|e| (self.store_err(e), None))?;
        let first = record.rv.is_none() && !record.synced;
        // A 410 is routine; a persisted RV the server cannot serve (restored etcd) is not.
        if first || reason.starts_with("410") {
            tracing::info!(scope = %self.scope(), reason, "listing");
        } else {
            tracing::warn!(scope = %self.scope(), reason, "relisting");
        }
        metrics::global()
            .lists
            .get_or_create(&metrics::ReasonLabels {
                resource: self.source.resource(),
                reason: metrics::reason_class(reason).to_owned(),
            })
            .inc();
        self.status.send_modify(|s| {
            s.lists += 1;
            if !first || s.lists > 1 {
                s.relists += 1;
            }
            s.last_list_reason = Some(reason.to_owned());
        });
        // Rows staged by a relist that never finished (a crash, or a stop mid-list) would count
        // as listed at this relist's finish and bring back objects deleted since.
        self.writer
            .abort_relist(self.scope())
            .await
            .map_err(|e| (self.store_err(e), None))?;
        let mut restarts = 0;
        loop {
            // Directly into an empty scope; staged (and swapped in at once) otherwise. Decided per
            // attempt: once an attempt wrote pages directly, a retry must diff against them, or
            // objects deleted between the attempts would stay.
            let mut direct = self.list_direct().map_err(|e| (self.store_err(e), None))?;
            let attempt = if self.config.streaming_list && !self.streaming_unsupported {
                match self.streaming_list(direct, stop).await {
                    Ok(r) => Ok(r),
                    Err((err, _)) => {
                        // Fall back to a paginated LIST on 422 (old server) or any error.
                        self.streaming_failed(&err);
                        self.writer
                            .abort_relist(self.scope())
                            .await
                            .map_err(|e| (self.store_err(e), None))?;
                        direct = self.list_direct().map_err(|e| (self.store_err(e), None))?;
                        self.paginated_list(direct).await
                    }
                }
            } else {
                self.paginated_list(direct).await
            };
            match attempt {
                Ok(Some(rv)) => {
                    if direct {
                        self.writer
                            .apply(self.new_batch().rv(rv.clone()).synced())
                            .await
                            .map_err(|e| (self.store_err(e), None))?;
                    } else {
                        let summary = self
                            .writer
                            .finish_relist(self.scope(), rv.clone(), reason)
                            .await
                            .map_err(|e| (self.store_err(e), None))?;
                        tracing::info!(scope = %self.scope(), added = summary.added, updated = summary.updated,
                            deleted = summary.deleted, unchanged = summary.unchanged, "relist applied as a diff");
                    }
                    return Ok(Some(rv));
                }
                Ok(None) => {
                    // Stopped mid-list: drop what was staged (a crash leaves it for the next
                    // list_all to drop).
                    let _ = self.writer.abort_relist(self.scope()).await;
                    return Ok(None);
                }
                Err(ListFailure::Restart(err)) if restarts < 3 => {
                    // An expired continue token: the list restarts from scratch.
                    restarts += 1;
                    tracing::info!(scope = %self.scope(), error = %err, "list restarted");
                    let _ = self.writer.abort_relist(self.scope()).await;
                }
                Err(ListFailure::Restart(err)) => {
                    return Err((
                        ReflectorError::ListRestarts {
                            resource: self.source.resource(),
                            restarts,
                            source: err,
                        },
                        None,
                    ))
                }
                Err(ListFailure::Failed(err, hint)) => {
                    let _ = self.writer.abort_relist(self.scope()).await;
                    return Err((err, hint));
                }
            }
        }
    }

    /// Whether a list goes directly into the scope: only while it is empty and has no RV.
    fn list_direct(&self) -> Result<bool, StoreError> {
        let record = self.store.record()?;
        Ok(record.rv.is_none() && record.object_count == 0)
    }

    /// A failed streaming list: the caller falls back to a paginated LIST. A server that does
    /// not support streaming lists (it refuses the parameters, or ignores them and never sends
    /// the end bookmark) is not asked again; any other failure (5xx, 429, I/O) is reported and
    /// the next list tries streaming again.
    fn streaming_failed(&mut self, err: &ReflectorError) {
        let unsupported = match err {
            ReflectorError::Source { source, .. } => match source {
                SourceError::Api { status, .. } => matches!(status.code, 400 | 404 | 405 | 415 | 422),
                SourceError::Decode { line: None, .. } => true,
                _ => false,
            },
            _ => false,
        };
        if unsupported {
            tracing::info!(scope = %self.scope(), error = %err, "the server does not support streaming lists; using paginated LIST");
            self.streaming_unsupported = true;
        } else {
            self.report(err);
            tracing::warn!(scope = %self.scope(), "streaming list failed; falling back to a paginated LIST this time");
        }
    }

    /// Sends one page of a list to the writer (directly into an empty scope, else staged) and
    /// queues its commit in `pipe`; `pipe` waits only when the writer already holds two pages.
    async fn put_page(&self, pipe: &mut PagePipe, direct: bool, items: Vec<RawObject>) -> Result<(), StoreError> {
        let items: Vec<RawObject> = items.into_iter().filter_map(|o| self.transform(o)).collect();
        if items.is_empty() {
            return Ok(());
        }
        let ack: BoxFuture<'static, Result<(), StoreError>> = if direct {
            let mut batch = self.new_batch();
            batch.deltas = items
                .into_iter()
                .map(|object| crate::store::Delta {
                    kind: DeltaKind::Replaced,
                    object,
                })
                .collect();
            let rx = self.writer.submit(batch)?;
            async move { rx.await.map_err(|_| StoreError::WriterGone)?.map(|_| ()) }.boxed()
        } else {
            let rx = self.writer.submit_stage(self.scope(), items)?;
            async move { rx.await.map_err(|_| StoreError::WriterGone)? }.boxed()
        };
        pipe.push(ack).await
    }

    async fn paginated_list(&mut self, direct: bool) -> Result<Option<ResourceVersion>, ListFailure> {
        let mut token = None;
        // The list's RV, from its first page; later pages are served at it.
        let mut list_rv = String::new();
        // Pages commit while the next one is fetched; all must have committed before the list
        // counts as done.
        let mut pipe = PagePipe::default();
        let put_failed = |this: &Self, e: StoreError| ListFailure::Failed(this.store_err(e), None);
        loop {
            let page = match self.list_page(token.clone()).await {
                Ok(p) => p,
                Err(e) if token.is_some() && e.status().is_some_and(|s| s.is_gone()) => {
                    return Err(ListFailure::Restart(e))
                }
                Err(e) => {
                    let hint = e.status().and_then(|s| s.retry_after);
                    return Err(ListFailure::Failed(
                        ReflectorError::Source {
                            source: e,
                            rv: list_rv,
                            continue_token: token,
                        },
                        hint,
                    ));
                }
            };
            let rv = page.resource_version.clone();
            list_rv.clone_from(&rv.0);
            self.put_page(&mut pipe, direct, page.items)
                .await
                .map_err(|e| put_failed(self, e))?;
            token = page.continue_token;
            if token.is_none() {
                pipe.drain().await.map_err(|e| put_failed(self, e))?;
                return Ok(Some(rv));
            }
        }
    }

    async fn list_page(&self, continue_token: Option<String>) -> Result<crate::source::ListPage, SourceError> {
        let req = ListRequest {
            limit: Some(self.config.page_size),
            continue_token,
            ..ListRequest::default()
        };
        metrics::global().list_requests.get_or_create(&self.labels()).inc();
        self.source.list(req).instrument(tracing::debug_span!("list")).await
    }

    async fn streaming_list(
        &mut self,
        direct: bool,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<Option<ResourceVersion>, (ReflectorError, Option<Duration>)> {
        let req = WatchRequest {
            resource_version: String::new(),
            timeout_secs: self.watch_timeout_secs(),
            bookmarks: true,
            send_initial_events: true,
        };
        let src_err = |e: SourceError| {
            let hint = e.status().and_then(|s| s.retry_after);
            (
                ReflectorError::Source {
                    source: e,
                    rv: String::new(),
                    continue_token: None,
                },
                hint,
            )
        };
        metrics::global().watch_requests.get_or_create(&self.labels()).inc();
        let mut stream = self.source.watch(req).await.map_err(src_err)?;
        let mut page = Vec::new();
        let mut pipe = PagePipe::default();
        loop {
            let ev = tokio::select! {
                ev = stream.next() => ev,
                _ = stop.wait_for(|s| *s) => return Ok(None),
            };
            match ev {
                Some(Ok(WatchEvent::Added(o) | WatchEvent::Modified(o))) => {
                    page.push(o);
                    if page.len() >= self.config.page_size as usize {
                        self.put_page(&mut pipe, direct, std::mem::take(&mut page))
                            .await
                            .map_err(|e| (self.store_err(e), None))?;
                    }
                }
                Some(Ok(WatchEvent::Bookmark {
                    resource_version,
                    initial_events_end: true,
                })) => {
                    self.put_page(&mut pipe, direct, page)
                        .await
                        .map_err(|e| (self.store_err(e), None))?;
                    pipe.drain().await.map_err(|e| (self.store_err(e), None))?;
                    return Ok(Some(resource_version));
                }
                Some(Ok(WatchEvent::Bookmark { .. } | WatchEvent::Deleted(_))) => {}
                Some(Ok(WatchEvent::Error(status))) => {
                    return Err(src_err(SourceError::Api {
                        resource: self.source.resource(),
                        status,
                    }))
                }
                Some(Err(e)) => return Err(src_err(e)),
                None => {
                    // A server that ignores sendInitialEvents sends no end bookmark.
                    return Err(src_err(SourceError::Decode {
                        resource: self.source.resource(),
                        line: None,
                        detail: "streaming list ended without the initial-events-end bookmark".into(),
                    }));
                }
            }
        }
    }

    fn watch_timeout_secs(&self) -> u32 {
        let (lo, hi) = self.config.watch_timeout;
        let (lo, hi) = (lo.as_secs().max(1), hi.as_secs().max(1));
        let secs = if hi > lo { rand::rng().random_range(lo..=hi) } else { lo };
        u32::try_from(secs).unwrap_or(u32::MAX)
    }

    /// The persisted RV (`fallback` when none is). While the store cannot be read (the writer
    /// reopens it after an I/O error) this waits: `fallback` may be older than what is persisted,
    /// and a watch from there would replay events over newer stored versions. `None` when stopped.
    async fn persisted_rv(
        &mut self,
        fallback: ResourceVersion,
        stop: &mut watch::Receiver<bool>,
    ) -> Option<ResourceVersion> {
        loop {
            match self.store.resource_version() {
                Ok(rv) => return Some(rv.unwrap_or(fallback)),
                Err(e) => {
                    self.report(&self.store_err(e));
                    let delay = self.backoff.delay(None);
                    if !self.sleep(delay, stop).await {
                        return None;
                    }
                }
            }
        }
    }

    /// One watch from `rv` until it ends. Batches events, pipelines commits (at most two in
    /// flight) and updates the committed RV on each durable acknowledgement.
    async fn watch_once(
        &mut self,
        rv: ResourceVersion,
        sync_target: &Option<ResourceVersion>,
        stop: &mut watch::Receiver<bool>,
    ) -> WatchEnd {
        let timeout_secs = self.watch_timeout_secs();
        let req = WatchRequest {
            resource_version: rv.0.clone(),
            timeout_secs,
            bookmarks: true,
            send_initial_events: false,
        };
        self.status.send_modify(|s| s.watches += 1);
        metrics::global().watch_requests.get_or_create(&self.labels()).inc();
        let mut stream = match self
            .source
            .watch(req)
            .instrument(tracing::debug_span!("watch", rv = %rv))
            .await
        {
            Ok(s) => s,
            Err(e) => return self.classify(e, &rv),
        };
        let idle = Duration::from_secs(u64::from(timeout_secs)) + self.config.stall_grace;
        // Counters resolved once per watch: a family lookup builds and hashes label strings.
        let counter = |kind: &str| {
            metrics::global()
                .events
                .get_or_create(&metrics::EventLabels {
                    resource: self.source.resource(),
                    kind: kind.to_owned(),
                })
                .clone()
        };
        let counters = [
            counter("ADDED"),
            counter("MODIFIED"),
            counter("DELETED"),
            counter("BOOKMARK"),
            counter("ERROR"),
        ];
        let batch_sizes = metrics::global().batch_size.get_or_create(&self.labels()).clone();
        let mut inflight: Inflight = VecDeque::new();
        // What the previous batch of this watch reaches; the next one requires it committed.
        let mut reached = rv.clone();
        let mut end = None;
        // The highest RV this watch has reached; batches never offer less.
        let mut high = rv.clone();
        let mut batch = self.new_batch().requires(reached.clone());
        let mut events = 0u64;
        // Group commit from this side: a batch is sent when the writer has nothing of ours in
        // flight (or it is full); events received meanwhile join the next one. Batches thus
        // grow with the commit latency instead of being capped by what the HTTP body happened
        // to have buffered (otherwise one fsync per few dozen events).
        while end.is_none() {
            let pending = batch.rv.is_some() || !batch.deltas.is_empty();
            let full = batch.deltas.len() >= self.config.max_batch;
            if pending && (inflight.is_empty() || full) && inflight.len() < MAX_INFLIGHT {
                let sent = std::mem::replace(&mut batch, self.new_batch());
                if let Err(e) = self.send_batch(
                    sent,
                    &rv,
                    std::mem::take(&mut events),
                    (&mut reached, &mut inflight),
                    &batch_sizes,
                ) {
                    end = Some(e);
                    break;
                }
                batch = batch.requires(reached.clone());
                continue;
            }
            if full {
                // The writer holds two of our batches: wait for the older one.
                if let Err(e) = self.settle(&mut inflight, sync_target, MAX_INFLIGHT - 1).await {
                    end = Some(e);
                }
                continue;
            }
            let next = match stream.next().now_or_never() {
                Some(item) => item,
                None => match inflight.front_mut() {
                    Some(front) => {
                        // Nothing received yet: take whichever comes first, a commit or an event.
                        let woke = tokio::select! {
                            biased;
                            r = &mut front.0 => Woke::Committed(r),
                            item = stream.next() => Woke::Item(item),
                            _ = stop.wait_for(|s| *s) => Woke::Stop,
                        };
                        match woke {
                            Woke::Committed(r) => {
                                if let Err(e) = self.settle_front(&mut inflight, r, sync_target) {
                                    end = Some(e);
                                }
                                continue;
                            }
                            Woke::Item(item) => item,
                            Woke::Stop => {
                                end = Some(WatchEnd::Stop);
                                break;
                            }
                        }
                    }
                    None => {
                        // Idle (nothing pending, nothing in flight). After a resume, a watch
                        // that stays quiet this long has nothing to catch up on: the server
                        // sends everything after our RV as soon as the watch opens.
                        let waiting = sync_target.is_some() && !self.status.borrow().synced;
                        let quiet = async {
                            match self.config.resume_quiet_period {
                                Some(d) if waiting => tokio::time::sleep(d).await,
                                _ => futures::future::pending().await,
                            }
                        };
                        tokio::select! {
                            ev = tokio::time::timeout(idle, stream.next()) => match ev {
                                Ok(item) => item,
                                Err(_) => {
                                    self.report(&ReflectorError::Source {
                                        source: SourceError::Transport {
                                            resource: self.source.resource(),
                                            detail: format!("watch stalled: nothing received for {idle:?}"),
                                        },
                                        rv: rv.0.clone(),
                                        continue_token: None,
                                    });
                                    end = Some(WatchEnd::Retry(None));
                                    break;
                                }
                            },
                            () = quiet => {
                                self.status.send_modify(|s| s.synced = true);
                                continue;
                            }
                            _ = stop.wait_for(|s| *s) => { end = Some(WatchEnd::Stop); break; }
                        }
                    }
                },
            };
            match next {
                None => end = Some(WatchEnd::Ended),
                Some(Err(e)) => end = Some(self.classify(e, &rv)),
                Some(Ok(ev)) => {
                    events += 1;
                    let kind = match &ev {
                        WatchEvent::Added(_) => 0,
                        WatchEvent::Modified(_) => 1,
                        WatchEvent::Deleted(_) => 2,
                        WatchEvent::Bookmark { .. } => 3,
                        WatchEvent::Error(_) => 4,
                    };
                    counters[kind].inc();
                    match ev {
                        WatchEvent::Added(o) | WatchEvent::Modified(o) => {
                            let rv = o.meta.resource_version.clone();
                            let delta = match self.transform_watched(o) {
                                Watched::Keep(object) => Some((DeltaKind::Updated, object)),
                                // Not stored: a stored older version must go too, as a
                                // relist would drop it (the writer ignores unknown keys).
                                Watched::Refused(tombstone) => tombstone.map(|t| (DeltaKind::Deleted, t)),
                            };
                            if let Some((kind, object)) = delta {
                                batch.deltas.push(crate::store::Delta { kind, object });
                            }
                            batch.rv = Some(forward(&mut high, rv));
                        }
                        WatchEvent::Deleted(o) => {
                            batch.rv = Some(forward(&mut high, o.meta.resource_version.clone()));
                            // The final state goes into the log: transformed like any
                            // stored version, or only its identity when refused.
                            if let Watched::Keep(object) | Watched::Refused(Some(object)) = self.transform_watched(o) {
                                batch.deltas.push(crate::store::Delta {
                                    kind: DeltaKind::Deleted,
                                    object,
                                });
                            }
                        }
                        WatchEvent::Bookmark { resource_version, .. } => {
                            if !resource_version.is_empty() {
                                batch.rv = Some(forward(&mut high, resource_version));
                            }
                        }
                        WatchEvent::Error(status) => {
                            let e = SourceError::Api {
                                resource: self.source.resource(),
                                status,
                            };
                            end = Some(self.classify(e, &rv));
                        }
                    }
                }
            }
        }
        // Whatever ended the watch, what was received is sent, and everything sent is settled
        // before the caller re-watches.
        if batch.rv.is_some() || !batch.deltas.is_empty() {
            if let Err(e) = self.send_batch(batch, &rv, events, (&mut reached, &mut inflight), &batch_sizes) {
                if matches!(end, None | Some(WatchEnd::Ended)) {
                    end = Some(e);
                }
            }
        }
        let settled = self.settle(&mut inflight, sync_target, 0).await;
        if let (None | Some(WatchEnd::Ended), Err(e)) = (&end, settled) {
            end = Some(e);
        }
        end.unwrap_or(WatchEnd::Ended)
    }

    /// Sends a watch batch to the writer; it joins `inflight`.
    fn send_batch(
        &self,
        batch: Batch,
        rv: &ResourceVersion,
        events: u64,
        (reached, inflight): (&mut ResourceVersion, &mut Inflight),
        batch_sizes: &Histogram,
    ) -> Result<(), WatchEnd> {
        let brv = batch.rv.clone().unwrap_or_else(|| rv.clone());
        batch_sizes.observe(batch.deltas.len() as f64);
        *reached = brv.clone();
        match self.writer.submit(batch) {
            Ok(rx) => {
                inflight.push_back((rx, brv, events, std::time::Instant::now()));
                Ok(())
            }
            Err(e) => {
                self.report(&self.store_err(e));
                Err(WatchEnd::Retry(None))
            }
        }
    }

    /// Awaits in-flight commits until at most `keep` remain, updating the committed RV.
    async fn settle(
        &self,
        inflight: &mut Inflight,
        sync_target: &Option<ResourceVersion>,
        keep: usize,
    ) -> Result<(), WatchEnd> {
        while inflight.len() > keep {
            let Some(front) = inflight.front_mut() else { break };
            let result = (&mut front.0).await;
            self.settle_front(inflight, result, sync_target)?;
        }
        Ok(())
    }

    /// Takes the oldest in-flight batch off `inflight` given its commit's `result`: on success
    /// the committed RV moves to it; on failure the error is reported and the watch ends.
    fn settle_front(
        &self,
        inflight: &mut Inflight,
        result: Result<Result<Committed, StoreError>, oneshot::error::RecvError>,
        sync_target: &Option<ResourceVersion>,
    ) -> Result<(), WatchEnd> {
        let Some((_, brv, n, sent)) = inflight.pop_front() else {
            return Ok(());
        };
        let err = match result {
            Ok(Ok(_)) => {
                metrics::global()
                    .commit_latency
                    .get_or_create(&self.labels())
                    .observe(sent.elapsed().as_secs_f64());
                self.status.send_modify(|s| {
                    s.committed_rv = Some(brv.clone());
                    s.events += n;
                });
                self.mark_synced_if_caught_up(&brv, sync_target, true);
                return Ok(());
            }
            Ok(Err(e)) => e,
            Err(_) => StoreError::WriterGone,
        };
        self.report(&self.store_err(err));
        // Later batches may or may not commit; the caller re-watches from what is persisted.
        inflight.clear();
        Err(WatchEnd::Retry(None))
    }

    fn classify(&self, e: SourceError, rv: &ResourceVersion) -> WatchEnd {
        let end = match e.status() {
            Some(s) if s.is_gone() => WatchEnd::Gone(s.message.clone()),
            Some(s) if s.is_too_large_rv() => WatchEnd::TooLarge(s.message.clone()),
            Some(s) => WatchEnd::Retry(s.retry_after),
            None => WatchEnd::Retry(None),
        };
        if !matches!(end, WatchEnd::Gone(_)) {
            self.report(&ReflectorError::Source {
                source: e,
                rv: rv.0.clone(),
                continue_token: None,
            });
        } else {
            tracing::info!(scope = %self.scope(), rv = %rv, "watch expired (410); relisting");
        }
        end
    }
}

/// The RV a batch offers after an event at `rv`: never older than what the watch reached, so
/// a stale RV (a DELETED carrying the object's last RV, kubernetes#58545) is not refused as a
/// regression, which would fail the batch and replay it on every re-watch.
fn forward(high: &mut ResourceVersion, rv: ResourceVersion) -> ResourceVersion {
    if !rv.is_empty() && !rv.is_older_than(high) {
        *high = rv;
    }
    high.clone()
}

/// A watched object after the transform.
enum Watched {
    /// Stored as it is now.
    Keep(RawObject),
    /// Refused (user function, size limit or failure); its identity-only tombstone, if any.
    Refused(Option<RawObject>),
}

/// Batches of one watch the writer may hold at once: one committing, one queued.
const MAX_INFLIGHT: usize = 2;

/// The commits of list pages sent but not yet acknowledged, at most [`MAX_INFLIGHT`]: the
/// next page is read and transformed while earlier ones commit. A page that fails fails the
/// list; later pages may have committed, which the next attempt handles (it diffs against
/// what a direct attempt wrote, and drops what a staged one staged).
#[derive(Default)]
struct PagePipe(VecDeque<BoxFuture<'static, Result<(), StoreError>>>);

impl PagePipe {
    async fn push(&mut self, ack: BoxFuture<'static, Result<(), StoreError>>) -> Result<(), StoreError> {
        self.0.push_back(ack);
        while self.0.len() > MAX_INFLIGHT {
            if let Some(oldest) = self.0.pop_front() {
                oldest.await?;
            }
        }
        Ok(())
    }

    async fn drain(&mut self) -> Result<(), StoreError> {
        while let Some(oldest) = self.0.pop_front() {
            oldest.await?;
        }
        Ok(())
    }
}

/// What woke a watch waiting for both its stream and a commit.
enum Woke<T> {
    Committed(Result<Result<Committed, StoreError>, oneshot::error::RecvError>),
    Item(Option<T>),
    Stop,
}

type Inflight = VecDeque<(
    oneshot::Receiver<Result<Committed, StoreError>>,
    ResourceVersion,
    u64,
    std::time::Instant,
)>;

enum ListFailure {
    Restart(SourceError),
    Failed(ReflectorError, Option<Duration>),
}
