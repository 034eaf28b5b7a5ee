//! Listing: a streaming list or a paginated LIST into the store, directly or staged as a diff.

use std::collections::VecDeque;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use tokio::sync::watch;
use tracing::Instrument;

use super::metrics;
use super::watching::MAX_INFLIGHT;
use super::{ListReason, Reflector, ReflectorError};
use crate::object::{RawObject, ResourceVersion};
use crate::source::{DecodeError, ListRequest, Source, SourceError, WatchEvent, WatchRequest};
use crate::store::{DeltaKind, Seq, StoreError};

impl<S: Source> Reflector<S> {
    /// A full list into the store. Returns the list RV and the log position of the commit that
    /// completed it, or `None` when stopped.
    pub(super) async fn list_all(
        &mut self,
        reason: &ListReason,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<Option<(ResourceVersion, Seq)>, (ReflectorError, Option<Duration>)> {
        let record = self.store.record().map_err(|e| (self.store_err(e), None))?;
        let first = record.rv.is_none() && !record.synced;
        // A 410 is routine; a persisted RV the server cannot serve (restored etcd) is not.
        if first || reason.is_routine() {
            tracing::info!(scope = %self.scope(), %reason, "listing");
        } else {
            tracing::warn!(scope = %self.scope(), %reason, "relisting");
        }
        metrics::global()
            .lists
            .get_or_create(&metrics::ReasonLabels {
                resource: self.source.resource(),
                reason: metrics::ListReasonLabel::from(reason),
            })
            .inc();
        self.status.send_modify(|s| {
            s.lists += 1;
            if !first || s.lists > 1 {
                s.relists += 1;
            }
            s.last_list_reason = Some(reason.clone());
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
                Ok(Some(rv)) if rv.is_empty() => {
                    let _ = self.writer.abort_relist(self.scope()).await;
                    let what = if self.config.streaming_list && !self.streaming_unsupported {
                        "initial-events-end bookmark"
                    } else {
                        "list"
                    };
                    return Err((
                        ReflectorError::NoResourceVersion {
                            resource: self.source.resource(),
                            what,
                        },
                        None,
                    ));
                }
                Ok(Some(rv)) => {
                    let seq = if direct {
                        self.writer
                            .apply(self.new_batch().rv(rv.clone()).synced())
                            .await
                            .map_err(|e| (self.store_err(e), None))?
                            .seq
                    } else {
                        let summary = self
                            .writer
                            .finish_relist(self.scope(), rv.clone(), &reason.to_string())
                            .await
                            .map_err(|e| (self.store_err(e), None))?;
                        tracing::info!(scope = %self.scope(), added = summary.added, updated = summary.updated,
                            deleted = summary.deleted, unchanged = summary.unchanged, "relist applied as a diff");
                        summary.seq
                    };
                    return Ok(Some((rv, seq)));
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
    pub(super) fn list_direct(&self) -> Result<bool, StoreError> {
        let record = self.store.record()?;
        Ok(record.rv.is_none() && record.object_count == 0)
    }

    /// A failed streaming list: the caller falls back to a paginated LIST. A server that does
    /// not support streaming lists (it refuses the parameters, or ignores them and never sends
    /// the end bookmark) is not asked again; any other failure (5xx, 429, I/O) is reported and
    /// the next list tries streaming again.
    pub(super) fn streaming_failed(&mut self, err: &ReflectorError) {
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
    pub(super) async fn put_page(
        &self,
        pipe: &mut PagePipe,
        direct: bool,
        items: Vec<RawObject>,
    ) -> Result<(), StoreError> {
        let items: Vec<RawObject> = self
            .keep_shard(items)
            .into_iter()
            .filter_map(|o| self.transform(o))
            .collect();
        if items.is_empty() {
            return Ok(());
        }
        // Charged to the store's memory budget until committed; waits while other pages fill
        // the bound of syncs in flight.
        let bytes = items
            .iter()
            .map(|o| o.bytes.len() + crate::store::memory::meta_bytes(&o.meta))
            .sum();
        let permit = self.store.memory().admit(bytes).await;
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
            committed(rx, permit, |r| r.map(|_| ()))
        } else {
            let rx = self.writer.submit_stage(self.scope(), items)?;
            committed(rx, permit, |r| r)
        };
        pipe.push(ack).await
    }

    pub(super) async fn paginated_list(&mut self, direct: bool) -> Result<Option<ResourceVersion>, ListFailure> {
        let mut token = None;
        // The list's RV, from its first page; later pages are served at it.
        let mut list_rv = ResourceVersion::default();
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
            list_rv.clone_from(&rv);
            self.note_shard_mode(page.shard_info.as_deref());
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

    pub(super) async fn list_page(
        &self,
        continue_token: Option<String>,
    ) -> Result<crate::source::ListPage, SourceError> {
        let req = ListRequest {
            limit: Some(self.config.page_size),
            continue_token,
            shard: self.config.sharding.clone(),
            ..ListRequest::default()
        };
        metrics::global().list_requests.get_or_create(&self.labels()).inc();
        self.source.list(req).instrument(tracing::debug_span!("list")).await
    }

    pub(super) async fn streaming_list(
        &mut self,
        direct: bool,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<Option<ResourceVersion>, (ReflectorError, Option<Duration>)> {
        let req = WatchRequest {
            resource_version: ResourceVersion::default(),
            timeout_secs: self.watch_timeout_secs(),
            bookmarks: true,
            send_initial_events: true,
            shard: self.config.sharding.clone(),
        };
        let src_err = |e: SourceError| {
            let hint = e.status().and_then(|s| s.retry_after);
            (
                ReflectorError::Source {
                    source: e,
                    rv: ResourceVersion::default(),
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
                    return Err(src_err(SourceError::decode(
                        self.source.resource(),
                        None,
                        DecodeError::NoInitialEventsEnd,
                    )));
                }
            }
        }
    }
}

/// A page's commit, its memory permit given back as soon as the writer answers (on a task of its
/// own: the pipe may not look at it for a while, and other reflectors wait for that room).
fn committed<T: Send + 'static>(
    rx: tokio::sync::oneshot::Receiver<Result<T, StoreError>>,
    permit: crate::store::memory::SyncPermit,
    map: fn(Result<T, StoreError>) -> Result<(), StoreError>,
) -> BoxFuture<'static, Result<(), StoreError>> {
    let answered = tokio::spawn(async move {
        let r = rx.await;
        drop(permit);
        r
    });
    async move {
        match answered.await {
            Ok(Ok(r)) => map(r),
            _ => Err(StoreError::WriterGone),
        }
    }
    .boxed()
}

/// The commits of list pages sent but not yet acknowledged, at most [`MAX_INFLIGHT`]: the
/// next page is read and transformed while earlier ones commit. A page that fails fails the
/// list; later pages may have committed, which the next attempt handles (it diffs against
/// what a direct attempt wrote, and drops what a staged one staged).
#[derive(Default)]
pub(super) struct PagePipe(VecDeque<BoxFuture<'static, Result<(), StoreError>>>);

impl PagePipe {
    pub(super) async fn push(&mut self, ack: BoxFuture<'static, Result<(), StoreError>>) -> Result<(), StoreError> {
        self.0.push_back(ack);
        while self.0.len() > MAX_INFLIGHT {
            if let Some(oldest) = self.0.pop_front() {
                oldest.await?;
            }
        }
        Ok(())
    }

    pub(super) async fn drain(&mut self) -> Result<(), StoreError> {
        while let Some(oldest) = self.0.pop_front() {
            oldest.await?;
        }
        Ok(())
    }
}

pub(super) enum ListFailure {
    Restart(SourceError),
    Failed(ReflectorError, Option<Duration>),
}
