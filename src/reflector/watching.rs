//! Watching: one watch from a resourceVersion, batched and pipelined into the writer.

use std::collections::VecDeque;
use std::time::Duration;

use crate::metrics::prom::Histogram;
use futures::{FutureExt, StreamExt};
use rand::Rng;
use tokio::sync::{oneshot, watch};
use tracing::Instrument;

use super::metrics;
use super::{Reflector, ReflectorError, SyncTarget};
use crate::object::{RawObject, ResourceVersion};
use crate::source::{Source, SourceError, WatchEvent, WatchRequest};
use crate::store::{Batch, Committed, DeltaKind, StoreError};

pub(super) enum WatchEnd {
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
    /// A new shard range was sent (see `Reflector::shard_updates`).
    Reshard,
    /// Commits not yet on disk were lost (a failed fsync, an I/O error): re-watch from what
    /// the file holds, at once, rather than when the next event finds its predecessor gone.
    RolledBack,
    /// A line that may have carried a change could not be read after the watch reached
    /// `at`: re-watch once (a line cut by a proxy reads fine the second time), relist if it
    /// fails again at the same place.
    Malformed { at: ResourceVersion, message: String },
}

/// What to do with a watch stream's error item: `None` ends the watch; `Some(false)` skips
/// the line and goes on (nothing of the store's state can be missing); `Some(true)` ends the
/// watch once what came before is committed, as [`WatchEnd::Malformed`] (the line may have
/// carried a change).
fn skip_line(e: &SourceError) -> Option<bool> {
    use crate::source::DecodeError;
    let SourceError::Decode { source, .. } = e else {
        return None;
    };
    match &**source {
        // A type this client does not know (client-go logs and skips it too), or an object
        // that is not a Kubernetes object: no store could hold it, so no list would either.
        DecodeError::UnknownType(_) | DecodeError::Object { .. } => Some(false),
        DecodeError::Envelope { event, .. } if event == "BOOKMARK" => Some(false),
        // The envelope itself is unreadable, or over the size cap: it may have been a change.
        DecodeError::NotAWatchEvent(_) | DecodeError::MissingObject { .. } | DecodeError::LineTooLong { .. } => {
            Some(true)
        }
        // The stream ended inside a line, or an ERROR event that does not decode: re-watch.
        _ => None,
    }
}

impl<S: Source> Reflector<S> {
    pub(super) fn watch_timeout_secs(&self) -> u32 {
        let (lo, hi) = self.config.watch_timeout;
        let (lo, hi) = (lo.as_secs().max(1), hi.as_secs().max(1));
        let secs = if hi > lo { rand::rng().random_range(lo..=hi) } else { lo };
        u32::try_from(secs).unwrap_or(u32::MAX)
    }

    /// The persisted RV (`Some(None)` when none is). While the store cannot be read (the writer
    /// reopens it after an I/O error) this waits: what this loop last saw may be older than what
    /// is persisted, and a watch from there would replay events over newer stored versions.
    /// `None` when stopped.
    pub(super) async fn persisted_rv(&mut self, stop: &mut watch::Receiver<bool>) -> Option<Option<ResourceVersion>> {
        loop {
            match self.store.resource_version() {
                Ok(rv) => return Some(rv),
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
    pub(super) async fn watch_once(
        &mut self,
        rv: ResourceVersion,
        sync_target: &Option<SyncTarget>,
        stop: &mut watch::Receiver<bool>,
    ) -> WatchEnd {
        let timeout_secs = if std::mem::take(&mut self.short_watch) {
            RESUME_WATCH_SECS
        } else {
            self.watch_timeout_secs()
        };
        let req = WatchRequest {
            resource_version: rv.clone(),
            timeout_secs,
            bookmarks: true,
            send_initial_events: false,
            shard: self.config.sharding.clone(),
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
            counter("SKIPPED"),
        ];
        let batch_sizes = metrics::global().batch_size.get_or_create(&self.labels()).clone();
        let mut inflight: Inflight = VecDeque::new();
        let mut rollbacks = self.writer.rollbacks();
        rollbacks.borrow_and_update();
        // What the previous batch of this watch reaches; the next one requires it committed.
        let mut reached = rv.clone();
        let mut end = None;
        // The highest RV this watch has reached; batches never offer less.
        let mut high = rv.clone();
        let mut batch = self.watch_batch().requires(reached.clone());
        let mut events = 0u64;
        // Group commit from this side: a batch is sent when the writer has nothing of ours in
        // flight (or it is full); events received meanwhile join the next one. Batches thus
        // grow with the commit latency instead of being capped by what the HTTP body happened
        // to have buffered (otherwise one fsync per few dozen events).
        while end.is_none() {
            if self
                .shard_rx
                .as_ref()
                .is_some_and(|rx| rx.has_changed().unwrap_or(false))
            {
                end = Some(WatchEnd::Reshard);
                break;
            }
            let pending = batch.rv.is_some() || !batch.deltas.is_empty();
            let full = batch.deltas.len() >= self.config.max_batch;
            if pending && (inflight.is_empty() || full) && inflight.len() < MAX_INFLIGHT {
                let sent = std::mem::replace(&mut batch, self.watch_batch());
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
                            Ok(()) = rollbacks.changed() => {
                                end = Some(WatchEnd::RolledBack);
                                break;
                            }
                            () = shard_changed(self.shard_rx.as_ref()) => continue,
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
                        let waiting =
                            sync_target.as_ref().is_some_and(SyncTarget::allows_quiet) && !self.status.borrow().synced;
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
                                        rv: rv.clone(),
                                        continue_token: None,
                                    });
                                    end = Some(WatchEnd::Retry(None));
                                    break;
                                }
                            },
                            () = shard_changed(self.shard_rx.as_ref()) => continue,
                            Ok(()) = rollbacks.changed() => {
                                end = Some(WatchEnd::RolledBack);
                                break;
                            }
                            () = quiet => {
                                // Nothing of ours in flight: the writer's position covers
                                // every entry of this scope.
                                self.mark_synced(*self.writer.committed().borrow());
                                continue;
                            }
                            _ = stop.wait_for(|s| *s) => { end = Some(WatchEnd::Stop); break; }
                        }
                    }
                },
            };
            match next {
                None => end = Some(WatchEnd::Ended),
                Some(Err(e)) => match skip_line(&e) {
                    None => end = Some(self.classify(e, &rv)),
                    Some(relist) => {
                        counters[5].inc();
                        let message = e.to_string();
                        self.report(&ReflectorError::Source {
                            source: e,
                            rv: high.clone(),
                            continue_token: None,
                        });
                        if relist {
                            end = Some(WatchEnd::Malformed {
                                at: high.clone(),
                                message,
                            });
                        }
                    }
                },
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
                        // Another shard's object (a server that ignores shardSelector): only
                        // its RV counts. An object never changes shard: its UID and namespace
                        // are immutable.
                        WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) if !self.owns(&o) => {
                            batch.rv = Some(forward(&mut high, o.meta.resource_version.clone()));
                        }
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
    pub(super) fn send_batch(
        &self,
        batch: Batch,
        rv: &ResourceVersion,
        events: u64,
        (reached, inflight): (&mut ResourceVersion, &mut Inflight),
        batch_sizes: &Histogram,
    ) -> Result<(), WatchEnd> {
        let brv = batch.rv.clone().unwrap_or_else(|| rv.clone());
        batch_sizes.observe(batch.deltas.len() as f64);
        // Invariant: the persisted RV never moves back; each batch requires the previous one.
        debug_assert!(!brv.is_older_than(reached), "batch RV {brv} is older than {reached}");
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
    pub(super) async fn settle(
        &self,
        inflight: &mut Inflight,
        sync_target: &Option<SyncTarget>,
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
    pub(super) fn settle_front(
        &self,
        inflight: &mut Inflight,
        result: Result<Result<Committed, StoreError>, oneshot::error::RecvError>,
        sync_target: &Option<SyncTarget>,
    ) -> Result<(), WatchEnd> {
        let Some((_, brv, n, sent)) = inflight.pop_front() else {
            return Ok(());
        };
        let err = match result {
            Ok(Ok(committed)) => {
                metrics::global()
                    .commit_latency
                    .get_or_create(&self.labels())
                    .observe(sent.elapsed().as_secs_f64());
                self.status.send_modify(|s| {
                    s.committed_rv = Some(brv.clone());
                    s.events += n;
                });
                self.mark_synced_if_caught_up(&brv, sync_target, true, committed.seq);
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

    pub(super) fn classify(&self, e: SourceError, rv: &ResourceVersion) -> WatchEnd {
        let end = match e.status() {
            Some(s) if s.is_gone() => WatchEnd::Gone(s.message.clone()),
            Some(s) if s.is_too_large_rv() => WatchEnd::TooLarge(s.message.clone()),
            Some(s) => WatchEnd::Retry(s.retry_after),
            None => WatchEnd::Retry(None),
        };
        if !matches!(end, WatchEnd::Gone(_)) {
            self.report(&ReflectorError::Source {
                source: e,
                rv: rv.clone(),
                continue_token: None,
            });
        } else {
            tracing::info!(scope = %self.scope(), rv = %rv, "watch expired (410); relisting");
        }
        end
    }
}

/// Resolves when a new shard range was sent; never without a channel (or once its sender is
/// gone: the range then stays as it is).
async fn shard_changed(rx: Option<&watch::Receiver<Option<crate::selector::ShardSelector>>>) {
    match rx {
        Some(rx) => {
            let mut rx = rx.clone();
            if rx.changed().await.is_err() {
                futures::future::pending::<()>().await;
            }
        }
        None => futures::future::pending().await,
    }
}

/// The RV a batch offers after an event at `rv`: never older than what the watch reached, so
/// a stale RV (a DELETED carrying the object's last RV, kubernetes#58545) is not refused as a
/// regression, which would fail the batch and replay it on every re-watch.
pub(super) fn forward(high: &mut ResourceVersion, rv: ResourceVersion) -> ResourceVersion {
    if !rv.is_empty() && !rv.is_older_than(high) {
        *high = rv;
    }
    high.clone()
}

/// A watched object after the transform.
pub(super) enum Watched {
    /// Stored as it is now.
    Keep(RawObject),
    /// Refused (user function, size limit or failure); its identity-only tombstone, if any.
    Refused(Option<RawObject>),
}

/// The timeout of a resume's first watch: the watch cache sends a bookmark 2 s before a watch's
/// timeout (otherwise once a minute; none at all for a watch shorter than 2 s), so this one
/// brings the cache's revision within about a second.
pub(super) const RESUME_WATCH_SECS: u32 = 3;

/// Batches of one watch the writer may hold at once: one committing, one queued.
pub(super) const MAX_INFLIGHT: usize = 2;

/// What woke a watch waiting for both its stream and a commit.
pub(super) enum Woke<T> {
    Committed(Result<Result<Committed, StoreError>, oneshot::error::RecvError>),
    Item(Option<T>),
    Stop,
}

pub(super) type Inflight = VecDeque<(
    oneshot::Receiver<Result<Committed, StoreError>>,
    ResourceVersion,
    u64,
    std::time::Instant,
)>;
