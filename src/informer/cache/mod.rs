//! The informer's read model: kube-runtime's `Store<K>` with the scope's keys, metadata, index
//! postings and a byte budget, fed by the store's [change stream](crate::store::Item), in one
//! place above the store (which stays bytes only).
//!
//! ## How a change flows
//!
//! The writer publishes each change of a group that commits without an fsync as soon as it has
//! decided it (any other group once it has committed). Whoever wakes first on the stream — the
//! cache's own task or a handler's — *pumps* it: under the cache's write lock it applies each
//! change (the new state's JSON, metadata and index values; the replaced entry is kept as the
//! update's old state and in the undo log), and marks the key pending for every volatile
//! handler ([`listener`]); after the lock, the metadata watchers (the controller's queue) are
//! called with the old and new entries. Each new state is decoded at most once, by its first
//! reader, and shared (`Arc<K>`) by every handler and lister. Listers read the same table, so a
//! handler never finds its lister older than its event (client-go's order: the indexer is
//! updated, then the listeners are told).
//!
//! ## Rollbacks
//!
//! A [`Rollback`](crate::store::Item::Rollback) takes back everything after a seq: the undo
//! log (every change not yet on disk, with the entry it replaced) restores those entries in
//! reverse order, and each restoration is one more change to the handlers, so a handler told
//! of a phantom add is told to delete it, and one told of a phantom update is told the
//! restored state. A rollback beyond the undo log (the cache's snapshot itself held commits
//! that were lost), a reader that fell behind the stream, or a reset make the cache load a new
//! snapshot and tell the handlers the difference, as a relist does.
//!
//! ## Memory
//!
//! Every key, metadata and posting is held; the JSON and decoded object only within the byte
//! budget (a change's object as the database compressed it; each charged what holds it and its
//! decoded form, at the size a decode of its type was measured to take). A load reads the JSON (within the budget)
//! only when volatile handlers are registered, whose initial adds and updates' previous states
//! need it; a cache read by listers alone loads without it, so a restart stays small. An entry
//! over the budget is evicted only once its change is on disk (at the latest one `fsync_delay`
//! after it was applied), so a cold entry can always be read back, and a state a rollback takes
//! back still has its JSON for the handlers told of it. A lister reads a cold entry from redb if
//! its resourceVersion is unchanged there, and answers from redb alone otherwise.

mod decoded;
mod interned;
mod listener;
mod objects;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};
use std::time::Duration;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use tokio::sync::{watch, Notify};

pub(crate) use listener::{Dirty, Listener, EXACT_LIMIT};
use objects::Objects;
pub(crate) use objects::{Entry, Json};

use crate::object::{ObjectError, ObjectKey, ObjectMeta};
use crate::store::{
    DeltaKind, IndexName, IndexStatus, Item, LogReader, Reader, ScopeId, Seq, Snapshot, Store, StoreError, Stream,
    StreamRead, Writer,
};
use crate::util::{Locked, RwLocked};

/// How many stream items one pump applies under one lock.
const PUMP_BATCH: usize = 256;

/// The most undo entries kept (with `StoreConfig::durable(false)` nothing ever becomes durable
/// before the next reopen); a rollback further back than these reloads.
const MAX_UNDO: usize = 1 << 20;

/// What a cache holds; see [`Informer::cache_stats`](super::Informer::cache_stats).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheStats {
    /// Whether it is loaded (before, and while it reloads, listers read the database).
    pub loaded: bool,
    /// Objects held (every object of the scope once loaded).
    pub objects: usize,
    /// Objects whose JSON is held (the others are read from the database when needed).
    pub with_json: usize,
    /// Bytes that hold their JSON: the database's compressed blob of a change's object (as
    /// [`StoreConfig::compression`](crate::store::StoreConfig::compression) stored it), the
    /// JSON itself for one read back or stored as received.
    pub json_bytes: usize,
    /// Bytes charged against the budget: each held object's `json_bytes` plus its decoded
    /// form, estimated from its JSON's size at what the cache measured decodes of its type to
    /// take (a k8s-openapi `Pod` several times more per byte of JSON than a `ConfigMap`).
    pub charged_bytes: usize,
    /// Bytes of keys, metadata and index postings (always held), as estimated and charged
    /// against the store's shared [`memory_budget`](crate::store::StoreConfig::memory_budget).
    pub held_bytes: usize,
    /// The budget.
    pub budget_bytes: usize,
    /// The last log seq it reflects.
    pub seq: Seq,
}

/// A metadata watcher's view of one change: the entries before and after (`None`: absent).
pub(crate) struct Watched<'a, K> {
    pub(crate) key: &'a ObjectKey,
    pub(crate) old: Option<&'a Arc<Entry<K>>>,
    pub(crate) new: Option<&'a Arc<Entry<K>>>,
}

type Watcher<K> = Arc<dyn Fn(Watched<'_, K>) + Send + Sync>;

/// One change the table took: the key, and its entries before and after.
type Changed<K> = (ObjectKey, Option<Arc<Entry<K>>>, Option<Arc<Entry<K>>>);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Not loaded yet, or reloading: readers use redb, handlers wait.
    Loading,
    Ready,
}

struct State<K> {
    phase: Phase,
    objects: Objects<K>,
    /// The last seq (of any scope) the table reflects.
    position: Seq,
    /// The stream the table follows, and the position in it the table reflects: a reader
    /// finding the stream further pumps first (so a lister never shows a change after the
    /// writer published its rollback).
    stream: Option<Arc<Stream>>,
    consumed: u64,
}

impl<K> State<K> {
    /// What the stream had published, when the table is behind it.
    fn behind(&self) -> Option<u64> {
        self.stream
            .as_ref()
            .map(|s| s.published())
            .filter(|&p| p > self.consumed)
    }
}

/// One change the table took, and the entry it replaced: what a rollback restores.
struct Undo<K> {
    seq: Seq,
    key: ObjectKey,
    before: Option<Arc<Entry<K>>>,
}

struct Pump<K> {
    /// `None` while (re)loading.
    reader: Option<Reader>,
    undo: VecDeque<Undo<K>>,
    /// Changes at or below this seq cannot be undone (they came with the snapshot).
    floor: Seq,
}

/// The read model of one informer, for objects of type `K`; see the module documentation.
pub(crate) struct Cache<K> {
    scope: ScopeId,
    store: Store,
    log: LogReader,
    writer: Writer,
    /// The byte budget; `usize::MAX` once [pinned](Self::pin).
    budget: AtomicUsize,
    /// Pinned for a [`Reader`](super::Reader): loads read every object's JSON, nothing is
    /// evicted, so sync reads never need redb.
    pinned: AtomicBool,
    /// A metadata-only informer's: see [`hold_metadata_once`](Self::hold_metadata_once).
    metadata_once: AtomicBool,
    /// Every object's JSON is held and the informer's sync point is in the table (set once, by
    /// [`warm`](Self::warm)).
    warm: watch::Sender<bool>,
    state: RwLock<State<K>>,
    pump: Mutex<Pump<K>>,
    listeners: Mutex<Vec<Arc<Listener<K>>>>,
    watchers: Mutex<Vec<(u64, Watcher<K>)>>,
    next_watcher: std::sync::atomic::AtomicU64,
    /// The informer's sync point (a log seq), once the reflector synced.
    sync_seq: watch::Receiver<Option<Seq>>,
    /// The position applied, and whether loaded: for waiters.
    applied: watch::Sender<(bool, Seq)>,
    /// Wakes the cache's task to (re)load.
    reload: Notify,
    /// A [`fill_for_listeners`](Self::fill_for_listeners) pass is running.
    filling: AtomicBool,
}

/// Clears a flag when dropped.
struct Reset<'a>(&'a AtomicBool);

impl Drop for Reset<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// What a volatile handler's next delivery needs: the key it pops, what it was told, and the
/// cache's state now.
pub(crate) struct Next<K> {
    pub(crate) dirty: Dirty<K>,
    /// The state to tell: the change's (told one by one), or the cache's now (folded).
    pub(crate) after: Option<Arc<Entry<K>>>,
    /// Told the cache's state now (the handler was far behind).
    pub(crate) folded: bool,
}

impl<K> Cache<K>
where
    K: DeserializeOwned + Send + Sync + 'static,
{
    /// A cache of `scope`, not loaded: [`run`](Self::run) loads and feeds it.
    pub(crate) fn new(
        store: Store,
        log: LogReader,
        writer: Writer,
        budget: usize,
        sync_seq: watch::Receiver<Option<Seq>>,
    ) -> Arc<Self> {
        let mut objects = Objects::default();
        objects.measure_with(objects::measure::<K>);
        objects.attach(store.memory().clone());
        Arc::new(Self {
            scope: store.scope(),
            store,
            log,
            writer,
            budget: AtomicUsize::new(budget),
            pinned: AtomicBool::new(false),
            metadata_once: AtomicBool::new(false),
            warm: watch::channel(false).0,
            state: RwLock::new(State {
                phase: Phase::Loading,
                objects,
                position: Seq(0),
                stream: None,
                consumed: 0,
            }),
            pump: Mutex::new(Pump {
                reader: None,
                undo: VecDeque::new(),
                floor: Seq(0),
            }),
            listeners: Mutex::new(Vec::new()),
            watchers: Mutex::new(Vec::new()),
            next_watcher: std::sync::atomic::AtomicU64::new(0),
            sync_seq,
            applied: watch::channel((false, Seq(0))).0,
            reload: Notify::new(),
            filling: AtomicBool::new(false),
        })
    }

    /// The cache's task: loads it, then keeps pumping the stream, reloading when it must,
    /// until the informer is dropped (`cache` is its only strong hold while it waits).
    pub(crate) async fn run(cache: std::sync::Weak<Self>) {
        let Some(c) = cache.upgrade() else { return };
        let mut sync = c.sync_seq.clone();
        let mut pressure = c.store.memory().pressure();
        let mut durable = c.writer.durable();
        drop(c);
        let mut first = true;
        let mut durable_gone = false;
        let mut backoff = Duration::from_millis(10);
        loop {
            let Some(c) = cache.upgrade() else { return };
            if c.pump.locked().reader.is_none() {
                match c.load(first).await {
                    Ok(()) => {
                        first = false;
                        backoff = Duration::from_millis(10);
                        // A handler registered while the load was under way.
                        if !c.listeners.locked().is_empty() {
                            tokio::spawn(Cache::fill_for_listeners(Arc::downgrade(&c)));
                        }
                    }
                    Err(StoreError::WriterGone) => return,
                    Err(e) => {
                        tracing::warn!(scope = %c.scope, error = %e, "the informer's cache could not load; retrying");
                        drop(c);
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                        continue;
                    }
                }
            }
            sync.borrow_and_update();
            c.pump_now();
            let Some(mut wake) = c.waker() else { continue };
            drop(c);
            let reload = async {
                if let Some(c) = cache.upgrade() {
                    c.reload.notified().await;
                }
            };
            tokio::select! {
                // Err: the stream was replaced by a reload, or the writer is gone (then the
                // next load says so).
                _ = wake.changed() => {}
                () = reload => {}
                // Another cache of the store is over the shared budget with nothing left to evict.
                _ = pressure.changed() => if let Some(c) = cache.upgrade() {
                    c.relieve();
                },
                // What was kept over the budget until on disk can go now.
                on_disk = durable.changed(), if !durable_gone => match (on_disk, cache.upgrade()) {
                    (Err(_), _) => durable_gone = true,
                    (Ok(()), Some(c)) => c.evict_on_disk(),
                    (Ok(()), None) => return,
                },
                changed = sync.changed() => if changed.is_err() {
                    // The informer is gone.
                    return;
                },
                // Now and then, to let go once the informer is dropped.
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    /// Loads a snapshot taken between two group commits with a stream reader after it, and
    /// tells handlers and watchers how it differs from what the table held (the first load:
    /// synthetic adds of the handlers' initial list).
    async fn load(&self, first: bool) -> Result<(), StoreError> {
        let sub = self.writer.subscribe(self.scope).await?;
        let indexes: Vec<IndexName> = self.store_indexes();
        let snapshot = sub.snapshot;
        // A pinned cache holds every object's JSON. So does, within its budget, one that tells
        // volatile handlers: their initial adds and each update's previous state read it anyway,
        // and one pass now costs far less than a read back per object later.
        let json_budget = if self.pinned.load(Ordering::Acquire) {
            usize::MAX
        } else if self.listeners.locked().is_empty() {
            0
        } else {
            self.budget.load(Ordering::Relaxed)
        };
        let memory = self.store.memory().clone();
        let (objects, position) =
            tokio::task::spawn_blocking(move || build::<K>(&snapshot, &indexes, json_budget, memory))
                .await
                .map_err(|e| StoreError::Aborted(format!("loading the cache: {e}")))??;
        let mut pump = self.pump.locked();
        let mut st = self.state.writing();
        let old = std::mem::replace(&mut st.objects, objects);
        // What differs from before (nothing held before the first load), for whoever is told:
        // handlers and watchers register under this lock, so none can come in meanwhile.
        let changes = if self.listeners.locked().is_empty() && self.watchers.locked().is_empty() {
            Vec::new()
        } else {
            diff(&old, &st.objects)
        };
        st.position = position;
        st.phase = Phase::Ready;
        st.stream = Some(sub.reader.stream());
        st.consumed = sub.reader.position();
        let listeners = self.listeners.locked().clone();
        // A handler registered while this load ran (a reload: the table was not serving) was
        // told nothing yet: its initial list is the whole new table, not what changed.
        let (fresh, told): (Vec<_>, Vec<_>) = listeners.iter().cloned().partition(|l| l.take_initial());
        for l in &fresh {
            tell_initial_list(l, &st.objects, position);
        }
        for (key, before, after) in &changes {
            let deleted = after.is_none();
            for l in &told {
                l.changed(&listener::Change {
                    key,
                    before: before.as_ref(),
                    after: after.as_ref(),
                    deleted: None,
                    final_state_unknown: deleted,
                    initial: first,
                    resync: false,
                    seq: position,
                });
            }
        }
        pump.reader = Some(sub.reader);
        pump.undo.clear();
        pump.floor = position;
        drop(st);
        drop(pump);
        tracing::debug!(scope = %self.scope, changed = changes.len(), "the informer's cache loaded");
        self.call_watchers(&changes);
        self.after_pump(position);
        for l in &listeners {
            l.notify.notify_one();
        }
        Ok(())
    }

    /// The indexes the scope has now, whose rows the cache serves as postings.
    fn store_indexes(&self) -> Vec<IndexName> {
        self.store.registered_indexes()
    }

    /// A receiver woken by every publication to the stream (`None` while loading).
    pub(crate) fn waker(&self) -> Option<watch::Receiver<u64>> {
        self.pump.locked().reader.as_ref().map(Reader::waker)
    }

    /// Applies what the stream holds, unless another task is at it (which then tells the
    /// handlers). Never blocks on I/O: a rollback beyond the undo log, or a reader that fell
    /// behind, hands over to the cache's task to reload.
    pub(crate) fn pump_now(&self) {
        let Ok(pump) = self.pump.try_lock() else { return };
        self.pump_locked(pump);
    }

    /// [`pump_now`](Self::pump_now), waiting for another task's pump to finish: for readers,
    /// which must not answer from a state the stream has moved past.
    fn pump_waiting(&self) {
        self.pump_locked(self.pump.locked());
    }

    /// The state to read, brought up to what the stream holds first.
    fn fresh(&self) -> RwLockReadGuard<'_, State<K>> {
        let st = self.state.reading();
        let Some(target) = st.behind() else {
            return st;
        };
        let stream = st.stream.clone();
        drop(st);
        // Up to what was published when the read came in. A pump that another task took over
        // midway stops where it handed over, so this goes on until there (or a reload).
        loop {
            self.pump_waiting();
            let st = self.state.reading();
            let same = match (&st.stream, &stream) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                _ => false,
            };
            if !same || st.consumed >= target {
                return st;
            }
        }
    }

    fn pump_locked<'a>(&'a self, mut pump: std::sync::MutexGuard<'a, Pump<K>>) {
        while let Some((items, head)) = self.next_batch(&mut pump) {
            let mut changes = Vec::with_capacity(items.len());
            let mut st = self.state.writing();
            let listeners = self.listeners.locked().clone();
            let mut reload = false;
            for item in &items {
                if !self.apply(&mut st, &mut pump, item, &listeners, &mut changes) {
                    reload = true;
                    break;
                }
            }
            if let Some(h) = head.filter(|_| !reload) {
                st.position = st.position.max(h);
            }
            // Only what is on disk: a rollback takes back only what is not, and the states it
            // takes back keep their JSON for the handlers told of them.
            let durable = *self.writer.durable().borrow();
            self.drop_transient(&mut st.objects, &listeners, durable);
            st.objects.evict(self.budget.load(Ordering::Relaxed), durable);
            if let Some(r) = pump.reader.as_ref() {
                st.consumed = r.position();
            }
            drop(st);
            self.trim_undo(&mut pump);
            if reload {
                self.start_reload(&mut pump);
            }
            // Watchers (the controller's queue) are called outside every lock.
            drop(pump);
            self.call_watchers(&changes);
            if reload || head.is_some() {
                break;
            }
            // Another task took over the stream meanwhile: it goes on from here.
            let Ok(next) = self.pump.try_lock() else { break };
            pump = next;
        }
        let position = self.state.reading().position;
        self.after_pump(position);
    }

    /// The stream's next items and, when they are its last, its head; `None` when there is
    /// nothing to read (loading, or a reader that fell behind: then a reload starts).
    fn next_batch(&self, pump: &mut Pump<K>) -> Option<(Vec<Arc<Item>>, Option<Seq>)> {
        match pump.reader.as_mut()?.read(PUMP_BATCH) {
            StreamRead::Items(items, head) if !items.is_empty() || head.is_some() => Some((items, head)),
            StreamRead::Items(..) => None,
            StreamRead::Lagged => {
                tracing::info!(scope = %self.scope, "the informer's cache fell behind the change stream; reloading");
                self.start_reload(pump);
                None
            }
        }
    }

    fn start_reload(&self, pump: &mut Pump<K>) {
        pump.reader = None;
        pump.undo.clear();
        let mut st = self.state.writing();
        st.phase = Phase::Loading;
        st.stream = None;
        drop(st);
        self.applied.send_modify(|(loaded, _)| *loaded = false);
        self.reload.notify_one();
    }

    /// Applies one item; `false` when only a reload can (a rollback past the undo log).
    fn apply(
        &self,
        st: &mut State<K>,
        pump: &mut Pump<K>,
        item: &Item,
        listeners: &[Arc<Listener<K>>],
        changes: &mut Vec<Changed<K>>,
    ) -> bool {
        match item {
            Item::Change(c) => {
                if c.kind == DeltaKind::Sync {
                    return true;
                }
                // The stored blob where there is one: a fraction of the JSON's size.
                let json = c
                    .packed
                    .clone()
                    .map(Json::Packed)
                    .or_else(|| c.new.clone().map(Json::Plain));
                let after = (c.kind != DeltaKind::Deleted)
                    .then(|| Arc::new(Entry::new(c.meta.clone(), c.values.clone(), c.seq, json)));
                let deleted = (c.kind == DeltaKind::Deleted && !c.final_state_unknown).then(|| {
                    Arc::new(Entry::new(
                        c.meta.clone(),
                        Arc::from(Vec::new()),
                        c.seq,
                        c.new.clone().map(Json::Plain),
                    ))
                });
                let (before, after) = put_new(&mut st.objects, &c.key, after);
                if !self.keeps_json(listeners) {
                    st.objects.mark_transient(&c.key);
                }
                if before.is_none() && after.is_none() {
                    return true;
                }
                for l in listeners {
                    l.changed(&listener::Change {
                        key: &c.key,
                        before: before.as_ref(),
                        after: after.as_ref(),
                        deleted: deleted.as_ref(),
                        final_state_unknown: c.final_state_unknown,
                        initial: false,
                        resync: false,
                        seq: c.seq,
                    });
                }
                pump.undo.push_back(Undo {
                    seq: c.seq,
                    key: c.key.clone(),
                    before: before.clone(),
                });
                st.position = c.seq;
                changes.push((c.key.clone(), before, after));
                true
            }
            Item::Rollback { to } => {
                if *to >= st.position {
                    return true;
                }
                if *to < pump.floor {
                    return false;
                }
                while pump.undo.back().is_some_and(|u| u.seq > *to) {
                    let Some(u) = pump.undo.pop_back() else { break };
                    let phantom = st.objects.put(&u.key, u.before.clone());
                    for l in listeners {
                        l.changed(&listener::Change {
                            key: &u.key,
                            before: phantom.as_ref(),
                            after: u.before.as_ref(),
                            deleted: None,
                            final_state_unknown: u.before.is_none(),
                            initial: false,
                            resync: false,
                            seq: u.seq,
                        });
                    }
                    changes.push((u.key, phantom, u.before));
                }
                st.position = *to;
                true
            }
            Item::Reset { at } => {
                let keys: Vec<ObjectKey> = st.objects.iter().map(|e| e.meta.key()).collect();
                for key in keys {
                    let before = st.objects.put(&key, None);
                    for l in listeners {
                        l.changed(&listener::Change {
                            key: &key,
                            before: before.as_ref(),
                            after: None,
                            deleted: None,
                            final_state_unknown: true,
                            initial: false,
                            resync: false,
                            seq: *at,
                        });
                    }
                    changes.push((key, before, None));
                }
                // Nothing before a reset can be restored from the undo log.
                pump.undo.clear();
                pump.floor = (*at).max(st.position);
                true
            }
        }
    }

    /// Drops the undo entries of changes on disk: no rollback goes back past them.
    fn trim_undo(&self, pump: &mut Pump<K>) {
        let durable = *self.writer.durable().borrow();
        while pump.undo.front().is_some_and(|u| u.seq <= durable) || pump.undo.len() > MAX_UNDO {
            if let Some(u) = pump.undo.pop_front() {
                pump.floor = pump.floor.max(u.seq);
            }
        }
    }

    fn call_watchers(&self, changes: &[Changed<K>]) {
        if changes.is_empty() {
            return;
        }
        let watchers: Vec<Watcher<K>> = self.watchers.locked().iter().map(|(_, w)| w.clone()).collect();
        for w in &watchers {
            for (key, old, new) in changes {
                w(Watched {
                    key,
                    old: old.as_ref(),
                    new: new.as_ref(),
                });
            }
        }
    }

    /// After the table moved to `position`: handlers reaching the informer's sync point, and
    /// waiters.
    fn after_pump(&self, position: Seq) {
        if let Some(sync) = *self.sync_seq.borrow() {
            if position >= sync {
                for l in self.listeners.locked().iter() {
                    l.set_barrier();
                }
            }
        }
        let loaded = self.state.reading().phase == Phase::Ready;
        self.applied.send_if_modified(|v| {
            let changed = *v != (loaded, position);
            *v = (loaded, position);
            changed
        });
    }

    /// Whether the informer's sync point is in the table.
    pub(crate) fn reached_sync(&self) -> bool {
        let st = self.state.reading();
        st.phase == Phase::Ready && self.sync_seq.borrow().is_some_and(|s| st.position >= s)
    }

    /// Registers a volatile handler: every object held now is pending for it as a synthetic
    /// add of its initial list (atomically with the changes the pump applies).
    pub(crate) fn listen(&self, limit: usize) -> Arc<Listener<K>> {
        let l = Arc::new(Listener::new(limit));
        let st = self.state.writing();
        if st.phase == Phase::Ready {
            tell_initial_list(&l, &st.objects, st.position);
            if self.sync_seq.borrow().is_some_and(|s| st.position >= s) {
                l.set_barrier();
            }
        } else {
            // Told its initial list when the load completes.
            l.await_initial();
        }
        self.listeners.locked().push(l.clone());
        drop(st);
        l
    }

    /// Removes a volatile handler.
    pub(crate) fn unlisten(&self, l: &Arc<Listener<K>>) {
        l.stop();
        self.listeners.locked().retain(|x| !Arc::ptr_eq(x, l));
    }

    /// Marks every object not already pending for `l` as a resync (told again as is).
    pub(crate) fn resync(&self, l: &Listener<K>) {
        let st = self.state.reading();
        for e in st.objects.iter() {
            l.changed(&listener::Change {
                key: &e.meta.key(),
                before: Some(e),
                after: Some(e),
                deleted: None,
                final_state_unknown: false,
                initial: false,
                resync: true,
                seq: st.position,
            });
        }
    }

    /// Registers a metadata watcher, called (outside the cache's lock) for every change the
    /// table takes, after it is called for every object held now (as adds). Returns its id.
    pub(crate) fn watch(&self, w: impl Fn(Watched<'_, K>) + Send + Sync + 'static) -> u64 {
        let id = self.next_watcher.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let w: Watcher<K> = Arc::new(w);
        let held: Vec<(ObjectKey, Arc<Entry<K>>)> = {
            let st = self.state.writing();
            self.watchers.locked().push((id, w.clone()));
            st.objects.iter().map(|e| (e.meta.key(), e.clone())).collect()
        };
        for (key, e) in &held {
            w(Watched {
                key,
                old: None,
                new: Some(e),
            });
        }
        id
    }

    /// Calls watcher `id` for every object held now, as unchanged (a resync).
    pub(crate) fn rewatch(&self, id: u64) {
        let Some(w) = self
            .watchers
            .locked()
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, w)| w.clone())
        else {
            return;
        };
        let held: Vec<(ObjectKey, Arc<Entry<K>>)> = self
            .state
            .reading()
            .objects
            .iter()
            .map(|e| (e.meta.key(), e.clone()))
            .collect();
        for (key, e) in &held {
            w(Watched {
                key,
                old: Some(e),
                new: Some(e),
            });
        }
    }

    /// Removes watcher `id`.
    pub(crate) fn unwatch(&self, id: u64) {
        self.watchers.locked().retain(|(i, _)| *i != id);
    }

    /// The next key `l` has to hear of, with the cache's state of it now (`None` while the
    /// cache loads: handlers wait for it).
    pub(crate) fn next(&self, l: &Listener<K>) -> Option<Next<K>> {
        let st = self.state.reading();
        if st.phase != Phase::Ready {
            return None;
        }
        let mut dirty = l.pop()?;
        let (after, folded) = match dirty.after.take() {
            Some(after) => (after, false),
            None => (st.objects.get(&dirty.key).cloned(), true),
        };
        Some(Next { dirty, after, folded })
    }

    /// The current entry of `key`, if the cache is loaded.
    pub(crate) fn entry(&self, key: &ObjectKey) -> Option<Option<Arc<Entry<K>>>> {
        let st = self.fresh();
        (st.phase == Phase::Ready).then(|| st.objects.get(key).cloned())
    }

    /// The position applied (and whether loaded), to wait on.
    pub(crate) fn applied(&self) -> watch::Receiver<(bool, Seq)> {
        self.applied.subscribe()
    }

    /// What the cache holds now.
    pub(crate) fn stats(&self) -> CacheStats {
        let st = self.state.reading();
        CacheStats {
            loaded: st.phase == Phase::Ready,
            objects: st.objects.len(),
            with_json: st.objects.with_json(),
            json_bytes: st.objects.json_bytes(),
            charged_bytes: st.objects.charged(),
            held_bytes: st.objects.held(),
            budget_bytes: self.budget.load(Ordering::Relaxed),
            seq: st.position,
        }
    }

    /// Evicts, down to the budget, what was kept over it until its change reached the disk.
    fn evict_on_disk(&self) {
        let durable = *self.writer.durable().borrow();
        if self.metadata_once.load(Ordering::Acquire) {
            let listeners = self.listeners.locked().clone();
            self.drop_transient(&mut self.state.writing().objects, &listeners, durable);
        }
        let cap = self.budget.load(Ordering::Relaxed);
        if self.state.reading().objects.charged() <= cap {
            return;
        }
        self.state.writing().objects.evict(cap, durable);
    }

    /// A metadata-only cache drops the JSON its changes brought once they are on disk, while
    /// no handler or reader decodes objects (then it keeps it, within the budget).
    fn drop_transient(&self, objects: &mut Objects<K>, listeners: &[Arc<Listener<K>>], durable: Seq) {
        if self.keeps_json(listeners) {
            objects.keep_transient();
        } else {
            objects.drop_transient(durable);
        }
    }

    /// Evicts this cache's own objects while the store's shared budget is over.
    fn relieve(&self) {
        let durable = *self.writer.durable().borrow();
        let cap = self.budget.load(Ordering::Relaxed);
        self.state.writing().objects.relieve(cap, durable);
    }

    /// Makes this a metadata-only informer's cache, whose objects' JSON is their metadata
    /// again: the table holds the parsed metadata of every object, and a change's JSON only
    /// until the change is on disk (a lister can read it back from then on), unless volatile
    /// handlers or a reader decode objects. A lister's read keeps the JSON it read within the
    /// budget, as for any evicted object.
    pub(crate) fn hold_metadata_once(&self) {
        self.metadata_once.store(true, Ordering::Release);
    }

    /// Whether a change's JSON stays in the table (within the budget) once on disk.
    fn keeps_json(&self, listeners: &[Arc<Listener<K>>]) -> bool {
        !self.metadata_once.load(Ordering::Acquire) || self.pinned.load(Ordering::Acquire) || !listeners.is_empty()
    }

    /// Pins the cache for a [`Reader`](super::Reader): no budget, and loads read every
    /// object's JSON. Returns whether it was pinned already.
    pub(crate) fn pin(&self) -> bool {
        self.budget.store(usize::MAX, Ordering::Relaxed);
        self.pinned.swap(true, Ordering::AcqRel)
    }

    /// Set once every object's JSON is held at (or after) the informer's sync point.
    pub(crate) fn warmed(&self) -> watch::Receiver<bool> {
        self.warm.subscribe()
    }

    /// The table as it is, whatever the phase (a reload keeps serving the previous table until
    /// the new one replaces it, as kube's reflector keeps its store until the relist ends),
    /// once [warm](Self::warm): `None` before.
    pub(crate) fn held(&self) -> Option<View<'_, K>> {
        if !*self.warm.borrow() {
            return None;
        }
        Some(View(self.fresh()))
    }

    /// A pinned cache's warm-up: waits for the informer's sync point to be in the table, then
    /// reads the JSON of every object the table holds without it (on a blocking thread, one
    /// snapshot per round) and sets [`warmed`](Self::warmed). Ends without setting it when the
    /// informer is dropped.
    pub(crate) async fn warm(cache: std::sync::Weak<Self>) {
        let Some(c) = cache.upgrade() else { return };
        let mut applied = c.applied();
        let mut sync = c.sync_seq.clone();
        drop(c);
        loop {
            let Some(c) = cache.upgrade() else { return };
            if !c.reached_sync() {
                drop(c);
                tokio::select! {
                    r = sync.changed() => if r.is_err() { return },
                    r = applied.changed() => if r.is_err() { return },
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
                continue;
            }
            let cold = c.cold().unwrap_or_default();
            if cold.is_empty() && c.view().is_some() {
                c.warm.send_replace(true);
                return;
            }
            let read = c.read_json(&cold).await;
            let mut filled = 0usize;
            match read {
                Ok(found) => {
                    // JSON only: each object is decoded by its first reader, as any other.
                    let mut st = c.state.writing();
                    for (e, bytes) in cold.iter().zip(found) {
                        if let Some(b) = bytes {
                            if st.objects.fill(e, b, usize::MAX).is_some() {
                                filled += 1;
                            }
                        }
                    }
                }
                Err(StoreError::WriterGone) => return,
                Err(e) => tracing::warn!(scope = %c.scope, error = %e, "warming the informer's cache; retrying"),
            }
            drop(c);
            if filled == 0 {
                // What is left changed in redb since the table took it (the pump brings the
                // new version with its JSON), or the read failed: wait a little.
                tokio::select! {
                    r = applied.changed() => if r.is_err() { return },
                    () = tokio::time::sleep(Duration::from_millis(50)) => {}
                }
            }
        }
    }

    /// The entries the table holds without their JSON, in key order (`None` while loading).
    fn cold(&self) -> Option<Vec<Arc<Entry<K>>>> {
        let v = self.view()?;
        Some(v.0.objects.iter().filter(|e| !e.has_json()).cloned().collect())
    }

    /// The JSON of each of `entries` at its version, from one redb snapshot read on a blocking
    /// thread (`None` for one that changed there since).
    async fn read_json(&self, entries: &[Arc<Entry<K>>]) -> Result<Vec<Option<Bytes>>, StoreError> {
        let store = self.store.clone();
        let wanted: Vec<(ObjectKey, crate::object::ResourceVersion)> = entries
            .iter()
            .map(|e| (e.meta.key(), e.meta.resource_version.clone()))
            .collect();
        tokio::task::spawn_blocking(move || -> Result<Vec<Option<Bytes>>, StoreError> {
            let snapshot = store.snapshot()?;
            wanted
                .iter()
                .map(|(key, rv)| {
                    let found = snapshot.get_with(key, |meta, bytes| {
                        if meta.resource_version == *rv {
                            bytes().map(Some)
                        } else {
                            Ok(None)
                        }
                    })?;
                    Ok(found.flatten())
                })
                .collect()
        })
        .await
        .map_err(|e| StoreError::Aborted(format!("reading objects' JSON: {e}")))?
    }

    /// Reads back, within the budget, the JSON of the objects the table holds without it, for
    /// volatile handlers (their initial adds read every object): a page per blocking read,
    /// while the handlers start telling (one meeting an object not read yet reads it itself).
    /// One pass at a time per cache; it ends at the budget, on an error, or when nothing is
    /// cold.
    pub(crate) async fn fill_for_listeners(cache: std::sync::Weak<Self>) {
        const PAGE: usize = 256;
        let Some(c) = cache.upgrade() else { return };
        if c.filling.swap(true, Ordering::AcqRel) {
            return;
        }
        let _done = Reset(&c.filling);
        let Some(cold) = c.cold() else { return };
        for page in cold.chunks(PAGE) {
            let budget = c.budget.load(Ordering::Relaxed);
            if c.state.reading().objects.charged() >= budget {
                return;
            }
            let Ok(found) = c.read_json(page).await else { return };
            let mut st = c.state.writing();
            for (e, bytes) in page.iter().zip(found) {
                if let Some(b) = bytes {
                    st.objects.fill(e, b, budget);
                }
            }
        }
    }

    /// A read view, when loaded.
    pub(crate) fn view(&self) -> Option<View<'_, K>> {
        let st = self.fresh();
        (st.phase == Phase::Ready).then_some(View(st))
    }

    /// Puts JSON read back from redb into a cold entry, the least recently written or read
    /// entries giving way to it, and decodes it there (once, for every later reader).
    pub(crate) fn fill(&self, entry: &Arc<Entry<K>>, bytes: Bytes) -> Result<Arc<K>, StoreError> {
        let durable = *self.writer.durable().borrow();
        let filled = self.state.writing().objects.fill_making_room(
            entry,
            bytes.clone(),
            self.budget.load(Ordering::Relaxed),
            durable,
        );
        match filled.and_then(|e| e.object()) {
            Some(k) => k.map_err(|_| decode_error::<K>(Some(&Json::Plain(bytes)))),
            None => serde_json::from_slice::<K>(&bytes)
                .map(Arc::new)
                .map_err(|e| StoreError::from(ObjectError::Json(e))),
        }
    }

    /// The decoded object of `entry`, reading a cold one back from redb (on a blocking thread,
    /// see [`read_back`](Self::read_back)). `None` when nothing holds it any more (compacted).
    pub(crate) async fn resolve(
        self: &Arc<Self>,
        entry: &Arc<Entry<K>>,
        replaced_by: Option<Seq>,
    ) -> Result<Option<Arc<K>>, StoreError> {
        if let Some(k) = entry.object() {
            return k.map(Some).map_err(|_| decode_error::<K>(entry.json()));
        }
        // The table may hold this version's JSON by now (read back since this entry was taken).
        if let Some(Some(held)) = self.entry(&entry.meta.key()) {
            if held.same_version(entry) {
                if let Some(k) = held.object() {
                    return k.map(Some).map_err(|_| decode_error::<K>(held.json()));
                }
            }
        }
        let bytes = tokio::task::spawn_blocking(self.read_back(entry, replaced_by))
            .await
            .map_err(|e| StoreError::Aborted(format!("reading a cold object: {e}")))??;
        match bytes {
            None => Ok(None),
            Some(b) => self.fill(entry, b).map(Some),
        }
    }

    /// A state a volatile handler was told, that the cache holds no JSON of any more (an update
    /// replaced it): read back and decoded on a blocking thread while the handler's task goes
    /// on (it decodes the new state meanwhile), as an entry of its own for the same version.
    /// `None` when it cannot be read (the handler's own read then says why).
    pub(crate) fn told_back(
        self: &Arc<Self>,
        told: &Arc<Entry<K>>,
        replaced_by: Seq,
    ) -> tokio::task::JoinHandle<Option<Arc<Entry<K>>>> {
        let read = self.read_back(told, Some(replaced_by));
        let (meta, values, seq) = (told.meta.clone(), told.values.clone(), told.seq);
        tokio::task::spawn_blocking(move || {
            let bytes = read().ok().flatten()?;
            let e = Arc::new(Entry::new(meta, values, seq, Some(Json::Plain(bytes))));
            // Decoded here, off the handler's task; an error is kept in the entry for it.
            let _ = e.object();
            Some(e)
        })
    }

    /// Reads `entry`'s JSON back from redb (blocking): from the object row if it still holds
    /// this version, else from the log entry that wrote it, else from the one that replaced it
    /// (`replaced_by`). Once the change that replaced it is committed the row holds a newer
    /// version, so the log is read first.
    fn read_back(
        &self,
        entry: &Entry<K>,
        replaced_by: Option<Seq>,
    ) -> impl FnOnce() -> Result<Option<Bytes>, StoreError> + Send + 'static {
        let (store, log, scope) = (self.store.clone(), self.log.clone(), self.scope);
        let (key, rv, seq) = (entry.meta.key(), entry.meta.resource_version.clone(), entry.seq);
        let committed = *self.writer.committed().borrow();
        let row_first = replaced_by.is_none_or(|r| r > committed);
        move || {
            let row = || {
                store
                    .get_with(&key, |meta, bytes| {
                        if meta.resource_version == rv {
                            bytes().map(Some)
                        } else {
                            Ok(None)
                        }
                    })
                    .map(Option::flatten)
            };
            if row_first {
                if let Some(b) = row()? {
                    return Ok(Some(b));
                }
            }
            if seq.0 > 0 {
                if let Some(r) = log.record(seq, scope)? {
                    if r.key == key && r.rv == rv && r.object.is_some() {
                        return Ok(r.object);
                    }
                }
            }
            if let Some(after) = replaced_by {
                // A rollback hands seqs out again: `after` may name another change of the key
                // by now, whose previous state is another version.
                if let Some(r) = log.record(after, scope)? {
                    if let Some(old) = r.old.filter(|o| r.key == key && version_of(o).is_some_and(|v| v == rv)) {
                        return Ok(Some(old));
                    }
                }
            }
            if row_first {
                return Ok(None);
            }
            // Compacted from the log: the row, should it still hold it.
            row()
        }
    }
}

/// What a key held before a put, and holds after it.
type Replaced<K> = (Option<Arc<Entry<K>>>, Option<Arc<Entry<K>>>);

/// Puts a new `entry` under `key`; returns what it replaced and the entry as held. The table
/// stamps a new entry with its place in the eviction queue, which it can only do while it holds
/// the one reference: a shared one would keep a stale place, and every older token of its key
/// would still name it (the queue then grows without end, and its sweep runs on every pump).
fn put_new<K>(objects: &mut Objects<K>, key: &ObjectKey, entry: Option<Arc<Entry<K>>>) -> Replaced<K> {
    let before = objects.put(key, entry);
    (before, objects.get(key).cloned())
}

/// What differs between two tables, in key order: each key whose version changed, with its
/// entries before and after (one merge of the two orders, no key copied but the changed).
fn diff<K>(old: &Objects<K>, new: &Objects<K>) -> Vec<Changed<K>> {
    use std::cmp::Ordering::{Equal, Greater, Less};
    let mut out = Vec::new();
    let (mut a, mut b) = (old.iter().peekable(), new.iter().peekable());
    loop {
        let order = match (a.peek(), b.peek()) {
            (None, None) => break,
            (Some(_), None) => Less,
            (None, Some(_)) => Greater,
            (Some(x), Some(y)) => key_of(x).cmp(&key_of(y)),
        };
        match (order, a.next_if(|_| order != Greater), b.next_if(|_| order != Less)) {
            (Equal, Some(before), Some(after)) => {
                if !before.same_version(after) {
                    out.push((before.meta.key(), Some(before.clone()), Some(after.clone())));
                }
            }
            (_, Some(before), None) => out.push((before.meta.key(), Some(before.clone()), None)),
            (_, None, Some(after)) => out.push((after.meta.key(), None, Some(after.clone()))),
            _ => break,
        }
    }
    out
}

/// An entry's key as the table orders it.
fn key_of<K>(e: &Entry<K>) -> (Option<&str>, &str) {
    (e.meta.namespace.as_deref(), e.meta.name.as_str())
}

/// Makes every object of `objects` pending for `l` as a synthetic add of its initial list.
fn tell_initial_list<K>(l: &Listener<K>, objects: &Objects<K>, position: Seq) {
    for e in objects.iter() {
        l.changed(&listener::Change {
            key: &e.meta.key(),
            before: None,
            after: Some(e),
            deleted: None,
            final_state_unknown: false,
            initial: true,
            resync: false,
            seq: position,
        });
    }
}

/// Reading an object's current metadata, whatever the cache's type.
pub(crate) trait MetaLookup: Send + Sync {
    fn meta(&self, key: &ObjectKey) -> Result<Option<Arc<ObjectMeta>>, StoreError>;
}

impl<K: DeserializeOwned + Send + Sync + 'static> MetaLookup for Cache<K> {
    fn meta(&self, key: &ObjectKey) -> Result<Option<Arc<ObjectMeta>>, StoreError> {
        if let Some(found) = self.entry(key) {
            return Ok(found.map(|e| e.meta.clone()));
        }
        // Not loaded yet: redb.
        self.store.get_with(key, |meta, _| Ok(Arc::new(meta.clone())))
    }
}

/// A read of the table at one state.
pub(crate) struct View<'a, K>(RwLockReadGuard<'a, State<K>>);

impl<K> View<'_, K> {
    pub(crate) fn len(&self) -> usize {
        self.0.objects.len()
    }

    pub(crate) fn named(&self, namespace: Option<&str>, name: &str) -> Option<&Arc<Entry<K>>> {
        self.0.objects.named(namespace, name)
    }

    pub(crate) fn select(&self, namespace: Option<&str>, keep: impl FnMut(&ObjectMeta) -> bool) -> Vec<Arc<Entry<K>>> {
        self.0.objects.select(namespace, keep)
    }

    pub(crate) fn by_index(&self, index: &str, value: &str) -> Option<Vec<Arc<Entry<K>>>> {
        self.0.objects.by_index(index, value)
    }

    /// The entries of one namespace or of the whole scope, in key order.
    pub(crate) fn scan(&self, namespace: Option<&str>) -> impl Iterator<Item = &Arc<Entry<K>>> + '_ {
        self.0.objects.scan(namespace)
    }
}

/// The resourceVersion stated in an object's JSON (`None` when its metadata does not scan).
fn version_of(json: &[u8]) -> Option<crate::object::ResourceVersion> {
    crate::object::extract_meta(json).ok().map(|m| m.resource_version)
}

/// The error of an entry whose JSON does not decode as `K` (decoded again for the message).
pub(crate) fn decode_error<K: DeserializeOwned>(json: Option<&Json>) -> StoreError {
    match json.map(Json::bytes) {
        Some(Ok(b)) => match serde_json::from_slice::<K>(&b) {
            Err(e) => StoreError::from(ObjectError::Json(e)),
            Ok(_) => StoreError::Aborted("the object does not decode".into()),
        },
        Some(Err(e)) => StoreError::from(e),
        None => StoreError::Aborted("the object does not decode".into()),
    }
}

/// Every key, metadata and complete index of the scope in `snapshot`, and its position, with
/// objects' JSON up to `json_budget` and while the store's shared budget allows (a pinned
/// cache's `usize::MAX`: every object's); the rest is left in redb, and reads and changes
/// bring it in.
fn build<K: DeserializeOwned>(
    snapshot: &Snapshot,
    indexes: &[IndexName],
    json_budget: usize,
    memory: Arc<crate::store::MemoryBudget>,
) -> Result<(Objects<K>, Seq), StoreError> {
    let position = snapshot.position()?;
    let mut values: HashMap<ObjectKey, Vec<(IndexName, Vec<String>)>> = HashMap::new();
    let mut served = Vec::new();
    for name in indexes {
        // An index still being backfilled is answered by redb (which refuses until it is done).
        if !matches!(snapshot.index_status(&name.0)?, IndexStatus::Ready) {
            continue;
        }
        served.push(name.clone());
        for (value, key) in snapshot.index_rows(name)? {
            let v = values.entry(key).or_default();
            match v.last_mut() {
                Some((n, vals)) if n == name => vals.push(value.0),
                _ => v.push((name.clone(), vec![value.0])),
            }
        }
    }
    let mut objects = Objects::with_indexes(&served);
    objects.measure_with(objects::measure::<K>);
    let shared = memory.clone();
    objects.attach(memory);
    snapshot.scan_versions(None, |key, meta, seq, bytes| {
        let vals = values.remove(&key).unwrap_or_default();
        // Up to the budget (one object over at most: the first pump evicts down to it).
        let room = json_budget == usize::MAX || !shared.over();
        let json = if room && objects.charged() < json_budget {
            Some(bytes()?)
        } else {
            None
        };
        let e = Arc::new(Entry::new(
            Arc::new(meta.clone()),
            vals.into(),
            seq,
            json.map(Json::Plain),
        ));
        objects.put(&key, Some(e));
        Ok(None::<()>)
    })?;
    Ok((objects, position))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, rv: u64) -> Arc<Entry<serde_json::Value>> {
        Arc::new(Entry::new(
            Arc::new(ObjectMeta {
                namespace: Some("ns".into()),
                name: name.into(),
                resource_version: rv.to_string().into(),
                ..ObjectMeta::default()
            }),
            Arc::from(Vec::new()),
            Seq(rv),
            Some(Json::Plain(Bytes::from_static(b"0123456789"))),
        ))
    }

    fn holds_json(t: &Objects<serde_json::Value>, name: &str) -> bool {
        t.get(&ObjectKey::namespaced("ns", name)).is_some_and(|e| e.has_json())
    }

    #[test]
    fn a_reload_tells_exactly_the_keys_whose_version_changed() {
        let (mut old, mut new) = (Objects::default(), Objects::default());
        let k = |n: &str| ObjectKey::namespaced("ns", n);
        // a: gone; b: same version; c: changed; d: new; e: same; f: gone (last).
        for (n, rv) in [("a", 1), ("b", 2), ("c", 3), ("e", 5), ("f", 6)] {
            put_new(&mut old, &k(n), Some(entry(n, rv)));
        }
        for (n, rv) in [("b", 2), ("c", 30), ("d", 4), ("e", 5)] {
            put_new(&mut new, &k(n), Some(entry(n, rv)));
        }
        let seq = |e: &Option<Arc<Entry<serde_json::Value>>>| e.as_ref().map(|e| e.seq.0);
        let got: Vec<(String, Option<u64>, Option<u64>)> = diff(&old, &new)
            .iter()
            .map(|(key, before, after)| (key.name.clone(), seq(before), seq(after)))
            .collect();
        let want = [
            ("a", Some(1), None),
            ("c", Some(3), Some(30)),
            ("d", None, Some(4)),
            ("f", Some(6), None),
        ]
        .map(|(n, b, a)| (n.to_owned(), b, a));
        assert_eq!(got, want);
        assert!(diff(&new, &new).is_empty());
        assert_eq!(diff(&Objects::default(), &new).len(), 4, "a first load: every object");
    }

    #[test]
    fn a_metadata_only_table_drops_marked_json_once_on_disk() {
        let mut t = Objects::default();
        let (a, b) = (ObjectKey::namespaced("ns", "a"), ObjectKey::namespaced("ns", "b"));
        put_new(&mut t, &a, Some(entry("a", 1)));
        t.mark_transient(&a);
        put_new(&mut t, &b, Some(entry("b", 2)));
        t.mark_transient(&b);
        t.drop_transient(Seq(1));
        assert!(!holds_json(&t, "a"), "on disk: dropped");
        assert!(holds_json(&t, "b"), "not on disk yet: a lister could not read it back");
        // A read back (a new entry of the same version) keeps its JSON.
        let cold = t.get(&a).cloned().unwrap();
        t.fill(&cold, Bytes::from_static(b"0123456789"), usize::MAX);
        t.drop_transient(Seq(2));
        assert!(holds_json(&t, "a"), "read back: kept");
        assert!(!holds_json(&t, "b"));
        // Marked, then someone decodes objects: kept.
        put_new(&mut t, &b, Some(entry("b", 3)));
        t.mark_transient(&b);
        t.keep_transient();
        t.drop_transient(Seq(3));
        assert!(holds_json(&t, "b"));
        assert!(t.consistent());
    }

    #[test]
    fn changes_applied_keep_the_eviction_order_oldest_first() {
        let mut t = Objects::default();
        let (a, b) = (ObjectKey::namespaced("ns", "a"), ObjectKey::namespaced("ns", "b"));
        put_new(&mut t, &a, Some(entry("a", 1)));
        put_new(&mut t, &b, Some(entry("b", 2)));
        let (before, held) = put_new(&mut t, &a, Some(entry("a", 3)));
        assert_eq!(before.map(|e| e.seq), Some(Seq(1)));
        assert_eq!(held.map(|e| e.seq), Some(Seq(3)), "the entry as held is returned");
        // Room for one object's JSON: the least recently written (b) goes, not a's newest.
        t.evict(40, Seq(3));
        assert!(holds_json(&t, "a"), "a was just written");
        assert!(!holds_json(&t, "b"));
        // Each key keeps being written: the oldest is still the one evicted.
        put_new(&mut t, &b, Some(entry("b", 4)));
        t.evict(40, Seq(4));
        assert!(!holds_json(&t, "a"));
        assert!(holds_json(&t, "b"));
    }

    /// A table holding `names` (written in that order, all on disk) with room for `room`.
    fn full(names: &[&str], room: usize) -> (Objects<serde_json::Value>, usize) {
        let mut t = Objects::default();
        for (i, n) in names.iter().enumerate() {
            put_new(&mut t, &ObjectKey::namespaced("ns", *n), Some(entry(n, i as u64 + 1)));
        }
        let one = t.charged() / names.len();
        let cap = one * room;
        t.evict(cap, Seq(names.len() as u64));
        (t, cap)
    }

    fn cold(t: &Objects<serde_json::Value>, name: &str) -> Arc<Entry<serde_json::Value>> {
        let e = t.get(&ObjectKey::namespaced("ns", name)).cloned().unwrap();
        assert!(!e.has_json(), "{name} is cold");
        e
    }

    #[test]
    fn a_full_table_takes_in_what_a_lister_reads_back_in_place_of_the_oldest() {
        // Room for two: a was evicted when c came.
        let (mut t, cap) = full(&["a", "b", "c"], 2);
        let a = cold(&t, "a");
        let bytes = || Bytes::from_static(b"0123456789");
        assert!(
            t.fill_making_room(&a, bytes(), cap, Seq(3)).is_none(),
            "read back once: not taken in"
        );
        assert!(holds_json(&t, "b") && holds_json(&t, "c"));
        let filled = t.fill_making_room(&a, bytes(), cap, Seq(3));
        assert!(filled.is_some_and(|e| e.has_json()), "read back again: held");
        assert!(holds_json(&t, "a") && holds_json(&t, "c"));
        assert!(!holds_json(&t, "b"), "the least recently written gave way");
        assert!(t.charged() <= cap);
        assert!(t.consistent());
        // What could never fit evicts nothing, however often read.
        let b = cold(&t, "b");
        for _ in 0..3 {
            assert!(t
                .fill_making_room(&b, Bytes::from_static(&[b'1'; 64]), cap, Seq(3))
                .is_none());
        }
        assert!(holds_json(&t, "a") && holds_json(&t, "c"));
    }

    #[test]
    fn an_entry_a_lister_read_outlasts_one_only_written() {
        let (mut t, cap) = full(&["a", "b"], 2);
        let a = t.get(&ObjectKey::namespaced("ns", "a")).cloned().unwrap();
        // (The test JSON does not decode as a `Value`: a read that fails counts as read too.)
        assert!(a.read().is_some());
        assert!(a.was_read());
        // c comes: b, written after a but never read, goes.
        put_new(&mut t, &ObjectKey::namespaced("ns", "c"), Some(entry("c", 3)));
        t.evict(cap, Seq(3));
        assert!(holds_json(&t, "a"), "read: a second chance");
        assert!(!holds_json(&t, "b"));
        assert!(!a.was_read(), "the chance is used up");
        // Its chance moved it behind c: c goes when d comes, then a, not read again, when e
        // comes.
        put_new(&mut t, &ObjectKey::namespaced("ns", "d"), Some(entry("d", 4)));
        t.evict(cap, Seq(4));
        assert!(holds_json(&t, "a") && holds_json(&t, "d"));
        assert!(!holds_json(&t, "c"));
        put_new(&mut t, &ObjectKey::namespaced("ns", "e"), Some(entry("e", 5)));
        t.evict(cap, Seq(5));
        assert!(!holds_json(&t, "a"));
        assert!(holds_json(&t, "d") && holds_json(&t, "e"));
        // Handlers' decoding is not a read.
        let d = t.get(&ObjectKey::namespaced("ns", "d")).cloned().unwrap();
        assert!(d.object().is_some());
        assert!(!d.was_read());
        assert!(t.consistent());
    }

    #[test]
    fn with_every_older_entry_read_the_unread_newest_goes_then_the_oldest() {
        let (mut t, cap) = full(&["a", "b", "c"], 3);
        for n in ["a", "b", "c"] {
            let e = t.get(&ObjectKey::namespaced("ns", n)).cloned().unwrap();
            assert!(e.read().is_some());
        }
        // d is written, never read: after one pass of second chances it is the one to go.
        put_new(&mut t, &ObjectKey::namespaced("ns", "d"), Some(entry("d", 4)));
        t.evict(cap, Seq(4));
        assert!(t.charged() <= cap);
        assert!(!holds_json(&t, "d"));
        assert!(["a", "b", "c"].iter().all(|n| holds_json(&t, n)));
        // Their chances used, the oldest goes next.
        put_new(&mut t, &ObjectKey::namespaced("ns", "e"), Some(entry("e", 5)));
        t.evict(cap, Seq(5));
        assert!(!holds_json(&t, "a"));
        assert!(["b", "c", "e"].iter().all(|n| holds_json(&t, n)));
        assert!(t.consistent());
    }

    proptest::proptest! {
        /// Writes, lister reads (of held and of cold entries, read back) and evictions in any
        /// order: the table stays consistent, within its cap once everything is on disk, and a
        /// read back that fits is held when read back a second time.
        #[test]
        fn reads_and_writes_keep_the_table_within_its_cap(
            ops in proptest::collection::vec((0u8..3, 0usize..6), 1..60),
            room in 1usize..5,
        ) {
            let names = ["a", "b", "c", "d", "e", "f"];
            let (mut t, cap) = full(&names, room);
            let mut seq = names.len() as u64;
            for (op, i) in ops {
                let key = ObjectKey::namespaced("ns", names[i]);
                match op {
                    0 => {
                        seq += 1;
                        put_new(&mut t, &key, Some(entry(names[i], seq)));
                        t.evict(cap, Seq(seq));
                    }
                    1 => {
                        let e = t.get(&key).cloned().unwrap();
                        if e.has_json() {
                            proptest::prop_assert!(e.read().is_some());
                        } else {
                            // Read back twice: the second is taken in whatever the first did.
                            let bytes = Bytes::from_static(b"0123456789");
                            if t.fill_making_room(&e, bytes.clone(), cap, Seq(seq)).is_none() {
                                let filled = t.fill_making_room(&e, bytes, cap, Seq(seq));
                                proptest::prop_assert!(filled.is_some(), "a read back that fits is held the second time");
                            }
                        }
                    }
                    _ => t.evict(cap, Seq(seq)),
                }
                proptest::prop_assert!(t.charged() <= cap, "{} > {cap}", t.charged());
                proptest::prop_assert!(t.consistent());
            }
        }
    }
}
