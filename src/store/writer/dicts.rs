//! Per-scope compression dictionaries: trained, stored with the group, published on commit.

use crate::util::RwLocked;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use redb::{ReadableTable, WriteTransaction};

use super::super::codec::Compression;
use super::super::dict::{self, EncDict};
use super::super::schema::{ScopeId, DICTS};
use super::super::StoreError;
use super::{Failure, PublishedDicts, Step, WriterThread};

/// The writer's compression dictionaries.
pub(super) struct Dictionaries {
    pub(super) compression: Compression,
    /// Per-scope state for [`Compression::ZstdDict`].
    pub(super) scopes: RefCell<HashMap<u32, ScopeDicts>>,
    /// The highest dictionary id handed out per scope in this process, kept across rollbacks:
    /// readers cache decoders by id for the process's life, so an id is never handed out twice.
    pub(super) handed_out: RefCell<HashMap<u32, u32>>,
    /// Scopes whose dictionary was trained in the open group: forgotten if it rolls back,
    /// published once it commits.
    pub(super) pending: RefCell<Vec<u32>>,
    /// Committed dictionaries, for [`Writer::submit`](super::Writer::submit) to compress with.
    pub(super) published: PublishedDicts,
}

impl Dictionaries {
    pub(super) fn new(compression: Compression, published: PublishedDicts) -> Self {
        Self {
            compression,
            scopes: RefCell::new(HashMap::new()),
            handed_out: RefCell::new(HashMap::new()),
            pending: RefCell::new(Vec::new()),
            published,
        }
    }
}

#[derive(Default)]
pub(super) struct ScopeDicts {
    /// Whether the newest committed dictionary was looked up.
    pub(super) loaded: bool,
    /// The dictionary new blobs are compressed with.
    pub(super) current: Option<Arc<EncDict>>,
    /// Objects kept to train the first dictionary on (`Bytes` clones: no copy).
    pub(super) samples: Vec<Bytes>,
}

impl WriterThread {
    /// Dictionaries trained in a group that did not commit were never stored: drop them (their
    /// ids are not handed out again, see `Dictionaries::handed_out`).
    pub(super) fn forget_pending_dicts(&self) {
        let mut dicts = self.dict.scopes.borrow_mut();
        for scope in self.dict.pending.borrow_mut().drain(..) {
            dicts.remove(&scope);
        }
    }

    /// The dictionary new blobs of `scope` are compressed with: the newest committed one, or
    /// one trained now (and stored in this transaction) once `objects` bring enough samples.
    /// Also returns how many leading `objects` come before it: when this batch completes the
    /// samples, the object that completes them and every later one use the new dictionary,
    /// the earlier ones do not. Where a dictionary starts thus depends only on the order of
    /// objects, never on where batches happen to begin, so replays give identical bytes.
    pub(super) fn scope_dict(
        &self,
        txn: &WriteTransaction,
        scope: ScopeId,
        objects: &[&Bytes],
    ) -> Step<(Option<Arc<EncDict>>, usize)> {
        let Compression::ZstdDict(level) = self.dict.compression else {
            return Ok((None, 0));
        };
        let mut all = self.dict.scopes.borrow_mut();
        let state = all.entry(scope.0).or_default();
        if !state.loaded {
            let table = txn.open_table(DICTS).map_err(|e| self.st(e))?;
            let newest = table
                .range((scope.0, 0)..=(scope.0, u32::MAX))
                .map_err(|e| self.st(e))?
                .next_back()
                .transpose()
                .map_err(|e| self.st(e))?;
            if let Some((k, v)) = newest {
                // A damaged row: the command is refused before it wrote anything (the group's
                // other commands commit), and so is every later one of the scope until the
                // file is repaired; blobs it compressed do not read either.
                let d = EncDict::new(scope.0, k.value().1, v.value(), level)
                    .map_err(|e| Failure::Refused(StoreError::from(e)))?;
                let d = Arc::new(d);
                // Read from the file: committed, so callers may compress with it.
                self.publish(scope.0, d.clone());
                state.current = Some(d);
            }
            state.loaded = true;
        }
        let mut before = 0;
        if state.current.is_none() {
            before = objects.len();
            for (i, b) in objects.iter().enumerate() {
                if state.samples.len() >= dict::TRAIN_SAMPLES {
                    break;
                }
                if !b.is_empty() {
                    state.samples.push((*b).clone());
                    before = i;
                }
            }
            if state.samples.len() >= dict::TRAIN_SAMPLES {
                let samples = std::mem::take(&mut state.samples);
                // A dictionary zstd trained but refuses to load counts as a failed training.
                let trained = dict::train(&samples).and_then(|raw| match EncDict::new(scope.0, 0, &raw, level) {
                    Ok(enc) => Some((raw, enc)),
                    Err(e) => {
                        tracing::warn!(error = %e, "zstd refused the dictionary it trained; objects stay compressed without one");
                        None
                    }
                });
                if let Some((raw, mut enc)) = trained {
                    let mut table = txn.open_table(DICTS).map_err(|e| self.st(e))?;
                    let in_file = table
                        .range((scope.0, 0)..=(scope.0, u32::MAX))
                        .map_err(|e| self.st(e))?
                        .next_back()
                        .transpose()
                        .map_err(|e| self.st(e))?
                        .map_or(1, |(k, _)| k.value().1 + 1);
                    // Never an id handed out before in this process, even one whose row a
                    // rollback took away: readers cache decoders by id for the process's life.
                    let mut handed_out = self.dict.handed_out.borrow_mut();
                    let id = handed_out.get(&scope.0).map_or(in_file, |last| in_file.max(last + 1));
                    handed_out.insert(scope.0, id);
                    drop(handed_out);
                    table.insert((scope.0, id), raw.as_slice()).map_err(|e| self.st(e))?;
                    enc.id = id;
                    state.current = Some(Arc::new(enc));
                    self.dict.pending.borrow_mut().push(scope.0);
                    tracing::debug!(%scope, id, bytes = raw.len(), "trained a zstd dictionary");
                }
            }
            if state.current.is_none() {
                before = objects.len();
            }
        }
        Ok((state.current.clone(), before))
    }

    pub(super) fn publish(&self, scope: u32, dict: Arc<EncDict>) {
        self.dict.published.writing().insert(scope, dict);
    }

    /// The dictionary `scope_dict` last settled on (call that first in the command).
    pub(super) fn scope_dict_cached(&self, scope: ScopeId) -> Option<Arc<EncDict>> {
        self.dict.scopes.borrow().get(&scope.0).and_then(|s| s.current.clone())
    }
}
