//! Sharding: the client-side filter, and a change of shard range at start (drop what is no
//! longer owned, fetch only the added ranges at the persisted resourceVersion).
//!
//! ```text
//!  start ── persisted range ≠ configured ──▶ change_shard (one transaction: delete objects
//!                                            outside the new range, save range + pending)
//!        ── pending ranges ──▶ Fetch: LIST pending at RV R, resourceVersionMatch=Exact
//!                               ├─ done ──▶ shard_fetched, Resume(R) (watch with the new range)
//!                               └─ 410  ──▶ List(Gone): relist as a diff (clears pending)
//! ```
//!
//! A crash between the steps is safe: the change is one transaction, the fetch lists the same
//! state (exactly R) again and re-applying a page is a no-op, and no watch event is applied
//! before the fetch completes, so the store never mixes states of two RVs.

use std::time::Duration;

use tokio::sync::watch;
use tracing::Instrument;

use super::listing::PagePipe;
use super::metrics;
use super::{ListReason, Reflector, ReflectorError, ShardMode, State, SyncTarget};
use crate::object::{RawObject, ResourceVersion};
use crate::selector::{ShardField, ShardSelector};
use crate::source::{ListRequest, Source};
use crate::store::{ShardRecord, StoreError};

/// Whether `object` belongs to `shard`: the same FNV-1a hash of the same field as the server.
fn in_shard(shard: &ShardSelector, object: &RawObject) -> bool {
    shard.matches(|f| match f {
        ShardField::Uid => object.meta.uid.as_deref(),
        ShardField::Namespace => object.meta.namespace.as_deref(),
    })
}

/// How a fetch of added ranges ended, when not done.
pub(super) enum FetchFailure {
    /// 410: the persisted RV was compacted; relist instead.
    Gone(String),
    /// Anything else: back off and fetch again.
    Failed(ReflectorError, Option<Duration>),
}

impl<S: Source> Reflector<S> {
    /// Drops objects whose shard the reflector does not own (all of them kept when unsharded).
    pub(super) fn keep_shard(&self, mut items: Vec<RawObject>) -> Vec<RawObject> {
        if let Some(shard) = &self.config.sharding {
            items.retain(|o| in_shard(shard, o));
        }
        items
    }

    /// Whether a watched object belongs to the reflector's shard.
    pub(super) fn owns(&self, object: &RawObject) -> bool {
        self.config.sharding.as_ref().is_none_or(|s| in_shard(s, object))
    }

    /// Records who filtered a sharded list page.
    pub(super) fn note_shard_mode(&self, shard_info: Option<&str>) {
        if self.config.sharding.is_none() {
            return;
        }
        let mode = if shard_info.is_some() {
            ShardMode::Server
        } else {
            ShardMode::Client
        };
        let changed = self.status.send_if_modified(|s| {
            let changed = s.shard_mode != Some(mode);
            s.shard_mode = Some(mode);
            changed
        });
        if changed && mode == ShardMode::Client {
            tracing::info!(scope = %self.scope(), "the server ignored shardSelector (no shardInfo): filtering the shard here");
        }
    }

    /// Brings the persisted shard range to the configured one: objects no longer owned are
    /// deleted, and on a synced scope the ranges it did not hold are recorded to be fetched at
    /// its RV. Returns the ranges left to fetch (also those of an earlier change not finished).
    pub(super) async fn reconcile_shard(&self) -> Result<Option<ShardSelector>, StoreError> {
        let held = self.store.shard()?;
        let desired = self.config.sharding.clone();
        if held.range == desired {
            return Ok(held.pending);
        }
        let record = self.store.record()?;
        let pending = if record.synced && record.rv.is_some() {
            let target = desired.clone().unwrap_or_else(ShardSelector::everything);
            let beyond = target.beyond(held.range.as_ref());
            // Ranges an earlier change added and did not finish fetching, still wanted.
            let unfinished = held.pending.as_ref().and_then(|p| p.intersect(&target));
            match (beyond, unfinished) {
                (Some(a), Some(b)) => Some(a.union(&b).unwrap_or(target)),
                (a, b) => a.or(b),
            }
        } else {
            // Not synced: the next list fetches the whole range anyway.
            None
        };
        let summary = self
            .writer
            .change_shard(
                self.scope(),
                ShardRecord {
                    range: desired.clone(),
                    pending: pending.clone(),
                },
            )
            .await?;
        tracing::info!(
            scope = %self.scope(),
            from = %held.range.as_ref().map_or_else(|| "everything".to_owned(), ToString::to_string),
            to = %desired.as_ref().map_or_else(|| "everything".to_owned(), ToString::to_string),
            kept = summary.unchanged,
            dropped = summary.deleted,
            to_fetch = %pending.as_ref().map_or_else(|| "nothing".to_owned(), ToString::to_string),
            "shard range changed"
        );
        Ok(pending)
    }

    /// Takes on a shard range sent while watching: the watch has committed what it received
    /// (up to `persisted`), so the change applies to a settled store. `None` when stopped.
    pub(super) async fn reshard(
        &mut self,
        persisted: ResourceVersion,
        sync_target: Option<SyncTarget>,
        stop: &mut watch::Receiver<bool>,
    ) -> Option<State> {
        if let Some(rx) = &mut self.shard_rx {
            self.config.sharding = rx.borrow_and_update().clone();
        }
        loop {
            match self.reconcile_shard().await {
                Ok(Some(added)) => return Some(State::Fetch { rv: persisted, added }),
                Ok(None) => {
                    return Some(State::Watch {
                        from: persisted,
                        sync_target,
                    })
                }
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

    /// The state after a fetch of the added ranges (`None` when stopped).
    pub(super) async fn fetch_step(
        &mut self,
        rv: ResourceVersion,
        added: ShardSelector,
        stop: &mut watch::Receiver<bool>,
    ) -> Option<State> {
        match self.fetch_added(&rv, &added, stop).await {
            Ok(true) => Some(State::Resume(rv)),
            Ok(false) => None,
            Err(FetchFailure::Gone(message)) => {
                tracing::info!(scope = %self.scope(), %rv, "the persisted resourceVersion is compacted: relisting the new shard range instead");
                Some(State::List(ListReason::Gone(message)))
            }
            Err(FetchFailure::Failed(err, hint)) => {
                self.report(&err);
                let delay = self.backoff.delay(hint);
                self.sleep(delay, stop).await.then_some(State::Fetch { rv, added })
            }
        }
    }

    /// Lists `added` exactly at `rv` (paginated) into the store, then records it fetched.
    /// `Ok(false)` when stopped midway (the next start fetches again).
    async fn fetch_added(
        &mut self,
        rv: &ResourceVersion,
        added: &ShardSelector,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<bool, FetchFailure> {
        tracing::info!(scope = %self.scope(), %rv, ranges = %added, "fetching the added shard ranges");
        let store_err = |this: &Self, e: StoreError| FetchFailure::Failed(this.store_err(e), None);
        let mut token: Option<String> = None;
        let mut pipe = PagePipe::default();
        let mut fetched = 0u64;
        loop {
            if *stop.borrow() {
                return Ok(false);
            }
            let req = ListRequest {
                // Continue pages carry the list's RV in their token.
                resource_version: token.is_none().then(|| rv.clone()),
                exact: true,
                limit: Some(self.config.page_size),
                continue_token: token.clone(),
                shard: Some(added.clone()),
                ..ListRequest::default()
            };
            metrics::global().list_requests.get_or_create(&self.labels()).inc();
            let page = match self
                .source
                .list(req)
                .instrument(tracing::debug_span!("shard fetch"))
                .await
            {
                Ok(p) => p,
                Err(e) if e.status().is_some_and(crate::source::ApiStatus::is_gone) => {
                    let _ = pipe.drain().await;
                    return Err(FetchFailure::Gone(e.to_string()));
                }
                Err(e) => {
                    let _ = pipe.drain().await;
                    let hint = e.status().and_then(|s| s.retry_after);
                    return Err(FetchFailure::Failed(
                        ReflectorError::Source {
                            source: e,
                            rv: rv.clone(),
                            continue_token: token,
                        },
                        hint,
                    ));
                }
            };
            self.note_shard_mode(page.shard_info.as_deref());
            let mut items = page.items;
            items.retain(|o| in_shard(added, o));
            fetched += items.len() as u64;
            // Objects at exactly `rv`, with no RV of their own for the scope: the scope's RV
            // stays `rv`, and a page applied twice (after a crash) changes nothing.
            self.put_page(&mut pipe, true, items)
                .await
                .map_err(|e| store_err(self, e))?;
            token = page.continue_token;
            if token.is_none() {
                break;
            }
        }
        pipe.drain().await.map_err(|e| store_err(self, e))?;
        self.writer
            .shard_fetched(self.scope())
            .await
            .map_err(|e| store_err(self, e))?;
        self.status.send_modify(|s| s.shard_fetched = Some(fetched));
        tracing::info!(scope = %self.scope(), fetched, "added shard ranges fetched");
        Ok(true)
    }
}
