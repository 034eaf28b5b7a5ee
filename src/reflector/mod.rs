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
mod config;
mod error;
mod listing;
#[cfg(feature = "metrics")]
pub mod metrics;
#[cfg(not(feature = "metrics"))]
mod metrics;
mod sharding;
mod status;
mod transform;
mod watching;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

pub use backoff::BackoffConfig;
pub use config::ReflectorConfig;
pub use error::ReflectorError;
pub use status::{ErrorHook, ListReason, Phase, ReflectorStatus, ShardMode};
pub use transform::{strip_managed_fields, tombstone, OversizePolicy, Transform, TransformError, TransformFn};
use watching::{WatchEnd, Watched};

use crate::object::{RawObject, ResourceVersion};
use crate::selector::ShardSelector;
use crate::source::{ListRequest, Source, SourceError};
use crate::store::{Batch, ScopeId, ScopeRecord, Seq, Store, StoreError, Writer};
use backoff::Backoff;

/// The reflector of one scope.
pub struct Reflector<S: Source> {
    source: S,
    writer: Writer,
    store: Store,
    config: ReflectorConfig,
    status: watch::Sender<ReflectorStatus>,
    on_error: Option<ErrorHook>,
    streaming_unsupported: bool,
    /// New shard ranges to take on while running (see [`Reflector::shard_updates`]).
    shard_rx: Option<watch::Receiver<Option<ShardSelector>>>,
    backoff: Backoff,
    /// Batches commit without an fsync (see [`Reflector::relaxed_commits`]).
    relaxed: bool,
    /// Where the last watch met a line it could not read (see [`WatchEnd::Malformed`]).
    malformed_at: Option<ResourceVersion>,
    /// The next watch is a resume's first, not yet synced: it asks for a short timeout, so the
    /// watch cache sends its bookmark soon.
    short_watch: bool,
}

/// Where the reflector's loop is; [`Reflector::step`] takes one state to the next.
#[derive(Debug)]
enum State {
    /// Restored from disk: probe the server's RV, then watch from the persisted one.
    Resume(ResourceVersion),
    /// List everything (the reason is logged, counted and kept in the status).
    List(ListReason),
    /// Watch from `from`. `sync_target` is the RV a resume must reach before the scope
    /// reports synced (`None` once synced by a list).
    Watch {
        from: ResourceVersion,
        sync_target: Option<SyncTarget>,
    },
    /// A change of shard range added `added`: list it at exactly `rv` (the persisted RV),
    /// then resume from `rv`.
    Fetch { rv: ResourceVersion, added: ShardSelector },
}

/// The payload a panicking user transform is re-raised with, so `run` can name it.
struct TransformPanicked(String);

/// What a resumed watch must reach before the scope reports synced.
#[derive(Debug, Clone)]
pub(crate) struct SyncTarget {
    /// The RV.
    rv: ResourceVersion,
    /// The watch cache's own revision of this resource: reaching it is exact, so no quiet
    /// period applies. Otherwise it is the cluster-wide RV, which a busy cluster moves past
    /// anything this resource's watch delivers.
    exact: bool,
    /// The server filters the watch (labels, fields, shard). The watch cache counts the
    /// events it filters out as sent and sends no bookmark at the RV of the last one
    /// (`cacheWatcher.process` only sends newer ones), so even an exact revision may be
    /// unreachable until the resource changes again: the quiet period stands in.
    filtered: bool,
}

impl SyncTarget {
    /// Whether the quiet period may stand in for reaching the target.
    pub(crate) fn allows_quiet(&self) -> bool {
        !self.exact || self.filtered
    }
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
            shard_rx: None,
            backoff,
            relaxed: false,
            malformed_at: None,
            short_watch: false,
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

    /// A batch of watch events: [`Deferred`](crate::store::Durability::Deferred), unless the
    /// reflector commits relaxed (a bulk load).
    fn watch_batch(&self) -> Batch {
        let batch = self.new_batch();
        if batch.durability == crate::store::Durability::Relaxed {
            batch
        } else {
            batch.durability(crate::store::Durability::Deferred)
        }
    }

    fn new_batch(&self) -> Batch {
        let mut batch = Batch::new(self.scope());
        if self.relaxed {
            batch.durability = crate::store::Durability::Relaxed;
        }
        batch
    }

    /// Takes on the shard range sent on `rx` while running, as a restart with it would (see
    /// [`ReflectorConfig::sharding`]): the current watch ends after committing what it
    /// received, the objects no longer owned are deleted, the added ranges fetched at the
    /// persisted resourceVersion, and the watch resumes with the new range. The value on `rx`
    /// when the reflector starts replaces `config.sharding`.
    #[must_use]
    pub fn shard_updates(mut self, rx: watch::Receiver<Option<ShardSelector>>) -> Self {
        self.shard_rx = Some(rx);
        self
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
        if matches!(err, ReflectorError::Store { .. } | ReflectorError::ClusterMismatch(_)) {
            metrics::global().store_errors.get_or_create(&self.labels()).inc();
        }
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

    /// Reports a failed request that was not about an RV (a probe, the identity) and waits
    /// the backoff, or the server's Retry-After; false on stop.
    async fn back_off(&mut self, e: SourceError, stop: &mut watch::Receiver<bool>) -> bool {
        let hint = e.status().and_then(|s| s.retry_after);
        self.report(&ReflectorError::Source {
            source: e,
            rv: ResourceVersion::default(),
            continue_token: None,
        });
        let delay = self.backoff.delay(hint);
        self.sleep(delay, stop).await
    }

    /// Runs until `stop` turns true (or is dropped), or a fatal error. Cancelling the future is
    /// also safe: every commit is atomic, and an unacknowledged batch is at most redelivered.
    ///
    /// A panic inside (in a user transform, or a bug of ours) ends it with
    /// [`ReflectorError::Panicked`]; any fatal error also clears `synced`: the store no longer
    /// follows the server.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) -> Result<(), ReflectorError> {
        use futures::FutureExt;
        let run = std::panic::AssertUnwindSafe(self.run_inner(&mut stop)).catch_unwind();
        let result = match run.await {
            Ok(result) => result,
            Err(payload) => {
                let (what, message) = match payload.downcast_ref::<TransformPanicked>() {
                    Some(TransformPanicked(m)) => ("transform", m.clone()),
                    None => ("reflector", crate::util::panic_message(&*payload)),
                };
                let err = ReflectorError::Panicked {
                    resource: self.source.resource(),
                    what,
                    message,
                };
                self.report(&err);
                Err(err)
            }
        };
        if result.is_err() {
            self.status.send_modify(|s| s.synced = false);
        }
        self.phase(Phase::Stopped);
        result
    }

    async fn run_inner(&mut self, stop: &mut watch::Receiver<bool>) -> Result<(), ReflectorError> {
        let Some((record, pending)) = self.start(stop).await? else {
            return Ok(());
        };
        let mut state = match record.rv.clone() {
            Some(rv) if record.synced => {
                self.status.send_modify(|s| {
                    s.restored = true;
                    s.committed_rv = Some(rv.clone());
                });
                match pending {
                    Some(added) => State::Fetch { rv, added },
                    None => State::Resume(rv),
                }
            }
            _ => State::List(ListReason::Initial),
        };
        loop {
            if *stop.borrow() {
                return Ok(());
            }
            match self.step(state, stop).await {
                Some(next) => state = next,
                None => return Ok(()),
            }
        }
    }

    /// One transition of the state machine; `None` when stopped.
    async fn step(&mut self, state: State, stop: &mut watch::Receiver<bool>) -> Option<State> {
        match state {
            State::Resume(rv) => {
                self.phase(Phase::Probing);
                // The watch cache's revision first: on servers that serve consistent reads
                // from the cache (v1.34+), the consistent probe below moves that revision up
                // to the cluster's, which no event of this resource may ever reach.
                let revision = self.cache_revision().await;
                match self.probe().await {
                    Ok(server_rv) if server_rv.is_older_than(&rv) => {
                        // etcd restored from an older backup (kubernetes#107457): a watch
                        // from our RV would be silently empty.
                        Some(State::List(ListReason::AheadOfServer {
                            persisted: rv,
                            server: server_rv,
                        }))
                    }
                    Ok(server_rv) => {
                        let spec = self.source.scope();
                        let selects = |s: &Option<String>| s.as_deref().is_some_and(|s| !s.is_empty());
                        let filtered = selects(&spec.label_selector)
                            || selects(&spec.field_selector)
                            || self.config.sharding.is_some();
                        let sync_target = Some(match revision {
                            Some(rv) => SyncTarget {
                                rv,
                                exact: true,
                                filtered,
                            },
                            None => SyncTarget {
                                rv: server_rv,
                                exact: false,
                                filtered,
                            },
                        });
                        let seq = *self.writer.committed().borrow();
                        self.mark_synced_if_caught_up(&rv, &sync_target, false, seq);
                        // A target no event of this resource reaches (the cache's revision
                        // moved with other clients' consistent reads) is reached by a bookmark,
                        // which the watch cache sends a watch 2 s before its timeout and only
                        // every minute otherwise: the first resumed watch is short (3 s).
                        self.short_watch = !self.status.borrow().synced;
                        Some(State::Watch { from: rv, sync_target })
                    }
                    Err(e) => self.back_off(e, stop).await.then_some(State::Resume(rv)),
                }
            }
            State::List(reason) => {
                self.phase(Phase::Listing);
                match self.list_all(&reason, stop).await {
                    Ok(Some((rv, seq))) => {
                        self.status.send_modify(|s| s.committed_rv = Some(rv.clone()));
                        self.mark_synced(seq);
                        Some(State::Watch {
                            from: rv,
                            sync_target: None,
                        })
                    }
                    Ok(None) => None,
                    Err((err, hint)) => {
                        self.report(&err);
                        let delay = self.backoff.delay(hint);
                        self.sleep(delay, stop).await.then_some(State::List(reason))
                    }
                }
            }
            State::Fetch { rv, added } => {
                self.phase(Phase::Listing);
                self.fetch_step(rv, added, stop).await
            }
            State::Watch { from, sync_target } => {
                self.phase(Phase::Watching);
                let end = self.watch_once(from.clone(), &sync_target, stop).await;
                // A resume not synced yet keeps its watches short: a loaded server may register
                // a watch too late to send the bookmark the first one was meant to bring.
                self.short_watch = sync_target.as_ref().is_some_and(|t| t.exact) && !self.status.borrow().synced;
                // Always continue from what is durably persisted, which may be ahead of what
                // this loop saw acknowledged (a commit reported failed may be durable).
                let Some(persisted) = self.persisted_rv(stop).await? else {
                    // A watch follows a list that persisted its RV: none now means a reopen
                    // after an I/O error took that list back (a store that does not fsync).
                    // Watching on from where this loop was would be refused for ever.
                    if matches!(end, WatchEnd::Stop) {
                        return None;
                    }
                    tracing::info!(scope = %self.scope(), "the scope's list was lost before reaching the disk; listing again");
                    return Some(State::List(ListReason::Initial));
                };
                let watch = |from| State::Watch {
                    from,
                    sync_target: sync_target.clone(),
                };
                match end {
                    WatchEnd::Stop => None,
                    WatchEnd::Reshard => self.reshard(persisted, sync_target, stop).await,
                    WatchEnd::Ended => Some(watch(persisted)),
                    WatchEnd::RolledBack => {
                        tracing::info!(scope = %self.scope(), rv = %persisted, "commits were lost before reaching the disk; re-watching from what the file holds");
                        self.status.send_modify(|s| s.committed_rv = Some(persisted.clone()));
                        Some(watch(persisted))
                    }
                    WatchEnd::Gone(message) => Some(State::List(ListReason::Gone(message))),
                    WatchEnd::TooLarge(message) => Some(State::List(ListReason::TooLargeRv { persisted, message })),
                    WatchEnd::Malformed { at, message } => {
                        if self.malformed_at.as_ref() == Some(&at) {
                            // The same line again: only a list can tell what it changed.
                            Some(State::List(ListReason::SkippedEvent(message)))
                        } else {
                            self.malformed_at = Some(at);
                            Some(watch(persisted))
                        }
                    }
                    WatchEnd::Retry(hint) => {
                        let delay = self.backoff.delay(hint);
                        self.sleep(delay, stop).await.then(|| watch(persisted))
                    }
                }
            }
        }
    }

    /// The cluster identity's check, the scope record and the shard range, before the first
    /// list or watch; `None` when stopped. A store error there (a failed commit, the file
    /// reopening after an I/O error) is reported and retried after the backoff, as it is once
    /// running; only a permanent one (another cluster's database, an unusable file) ends the
    /// run.
    async fn start(
        &mut self,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<Option<(ScopeRecord, Option<ShardSelector>)>, ReflectorError> {
        loop {
            let err = match self.start_once(stop).await {
                Ok(started) => return Ok(started),
                Err(e @ StoreError::ClusterMismatch { .. }) => {
                    let err = ReflectorError::ClusterMismatch(Arc::new(e));
                    self.report(&err);
                    return Err(err);
                }
                Err(e) if permanent(&e) => {
                    let err = self.store_err(e);
                    self.report(&err);
                    return Err(err);
                }
                Err(e) => self.store_err(e),
            };
            self.report(&err);
            let delay = self.backoff.delay(None);
            if !self.sleep(delay, stop).await {
                return Ok(None);
            }
        }
    }

    async fn start_once(
        &mut self,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<Option<(ScopeRecord, Option<ShardSelector>)>, StoreError> {
        if !self.check_identity(stop).await? {
            return Ok(None);
        }
        let record = self.store.record()?;
        if let Some(rx) = &mut self.shard_rx {
            self.config.sharding = rx.borrow_and_update().clone();
        }
        // After the identity check: a database reset for another cluster holds nothing to keep.
        let pending = self.reconcile_shard().await?;
        Ok(Some((record, pending)))
    }

    /// Checks (and on a new database records) the server's cluster identity; false when
    /// stopped while the server could not tell it.
    async fn check_identity(&mut self, stop: &mut watch::Receiver<bool>) -> Result<bool, StoreError> {
        let identity = loop {
            match self.source.cluster_identity().await {
                Ok(id) => break id,
                Err(e) => {
                    if !self.back_off(e, stop).await {
                        return Ok(false);
                    }
                }
            }
        };
        let Some(identity) = identity else { return Ok(true) };
        let wiped = self
            .writer
            .cluster_identity(&identity, self.config.reset_on_cluster_change)
            .await?;
        if wiped {
            tracing::warn!(%identity, "database belonged to another cluster and was reset");
        }
        Ok(true)
    }

    /// What a resume must have applied before it reports synced: the watch cache's revision of
    /// this resource (an RV=0 LIST that matches no object); `None` when the server does not
    /// say (then the cluster-wide RV and a quiet period stand in).
    ///
    /// The resumed watch is served from that same cache, which sends every event it holds
    /// after our RV as soon as the watch opens; once the committed RV reaches the cache's
    /// revision, everything the server held for this resource when we asked is applied. The
    /// cluster-wide RV is no target on a busy cluster: other resources move it, and no event of
    /// this resource may ever reach it. Where the cache lags etcd, the view is as fresh as
    /// client-go's initial list, which reads the same cache (`resourceVersion=0`).
    async fn cache_revision(&self) -> Option<ResourceVersion> {
        metrics::global().list_requests.get_or_create(&self.labels()).inc();
        let req = ListRequest {
            resource_version: Some("0".into()),
            revision_only: true,
            ..ListRequest::default()
        };
        match self.source.list(req).await {
            Ok(page) if page.resource_version.as_u64().is_some() => Some(page.resource_version),
            Ok(page) => {
                tracing::debug!(scope = %self.scope(), rv = %page.resource_version, "revision probe: no integer RV");
                None
            }
            Err(e) => {
                tracing::debug!(scope = %self.scope(), error = %e, "revision probe failed; waiting for the server's RV");
                None
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

    /// Marks the scope synced once `committed` (acknowledged at log position `seq`) reaches
    /// the resume's `target`.
    fn mark_synced_if_caught_up(
        &self,
        committed: &ResourceVersion,
        target: &Option<SyncTarget>,
        progressed: bool,
        seq: Seq,
    ) {
        let caught_up = match target {
            None => false,
            Some(t) => match (committed.as_u64(), t.rv.as_u64()) {
                (Some(c), Some(t)) => c >= t,
                // Not comparable: the first event or bookmark after the probe.
                _ => progressed,
            },
        };
        if caught_up {
            self.mark_synced(seq);
        }
    }

    /// The store holds a complete, current view as of log position `seq` (every entry of this
    /// scope up to it is part of that view). The first time only: later relists keep the
    /// informer's sync point.
    fn mark_synced(&self, seq: Seq) {
        self.status.send_if_modified(|s| {
            if s.synced {
                return false;
            }
            s.synced = true;
            s.synced_seq = Some(seq);
            true
        });
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
        // A panic in the user's function stops the reflector (see `run`), named as its own.
        let applied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.config.transform.apply(obj)))
            .unwrap_or_else(|p| {
                std::panic::resume_unwind(Box::new(TransformPanicked(crate::util::panic_message(&*p))))
            });
        match applied {
            Ok(o) => o,
            Err(e) => {
                let rv = crate::object::extract_meta(&original)
                    .map(|m| m.resource_version)
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
}

/// Whether a store error met while starting stays whatever the reflector does: retrying it
/// cannot succeed until someone acts on the file (each such error says what to do).
fn permanent(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::ClusterMismatch { .. }
            | StoreError::NotADatabase { .. }
            | StoreError::Locked { .. }
            | StoreError::Corrupted { .. }
            | StoreError::NewerSchema { .. }
            | StoreError::OlderSchema { .. }
            | StoreError::NeedsRecovery { .. }
            | StoreError::UnknownScope(_)
    )
}
