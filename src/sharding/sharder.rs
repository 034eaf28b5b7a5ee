//! The sharder: watches a ring's shard Leases and the sharded objects' metadata, and keeps every
//! object labelled with the shard the consistent-hash ring assigns it to.
//!
//! ```text
//!  Lease events ──▶ ShardLeases (states on the sharder's clock) ──▶ ring of available shards
//!                     ├─ uncertain ──▶ take the Lease (fences the shard) ──▶ dead
//!                     └─ orphaned ──▶ delete the Lease
//!  object events ──▶ plan: key ─ring─▶ desired shard, compared with the shard label
//!                     ├─ unassigned, or its shard dead ──▶ label it (merge patch, RV precondition)
//!                     ├─ its shard alive, owned object  ──▶ relabel it directly
//!                     └─ its shard alive, ring object   ──▶ add the drain label; the shard removes
//!                        both labels (acknowledge) ──▶ unassigned ──▶ label it
//! ```
//!
//! Every write is a JSON merge patch carrying the resourceVersion the decision was made on: a
//! conflict means the object changed meanwhile, so the sharder reads it again, decides again,
//! and retries (a few times; the next event or resync covers the rest).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::core::{ApiResource, DynamicObject, PartialObjectMeta, Resource};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;

use super::lease::{ShardLeases, ShardState, SHARDER_IDENTITY};
use super::ring::{controller_ring_key, ring_key, HashRing, DEFAULT_TOKENS_PER_SHARD};
use super::ShardingError;
use crate::leader::{KubeLeaseLock, LeaseLock, LeaseRecord};
use crate::selector::RingLabels;

/// How many times a write that met a conflict is decided again and retried.
const CONFLICT_RETRIES: usize = 5;

/// Events taken in one go before deciding.
const MAX_BATCH: usize = 10_000;

/// A resource whose objects the sharder assigns.
///
/// ```
/// use durable_informer::sharding::ShardedResource;
/// use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
/// // Deployments are the ring's objects; ReplicaSets follow their controlling Deployment.
/// let resources = [ShardedResource::of::<Deployment>(), ShardedResource::of::<ReplicaSet>().by_controller()];
/// assert!(resources[1].is_by_controller());
/// ```
#[derive(Debug, Clone)]
pub struct ShardedResource {
    resource: ApiResource,
    by_controller: bool,
}

impl ShardedResource {
    /// The objects of `K`, each hashed by its own `group/kind/namespace/name`.
    #[must_use]
    pub fn of<K: Resource<DynamicType = ()>>() -> Self {
        Self::dynamic(ApiResource::erase::<K>(&()))
    }

    /// The objects of any resource (a CRD's, say).
    #[must_use]
    pub fn dynamic(resource: ApiResource) -> Self {
        Self {
            resource,
            by_controller: false,
        }
    }

    /// Hashes each object by its controller's key instead (its owner reference with
    /// `controller: true`), so it lands on its owner's shard; objects without a controller are
    /// left unassigned. Such objects are relabelled directly when their owner moves (the
    /// owner's drain is the handshake that matters), as timebertt's sharder does.
    #[must_use]
    pub fn by_controller(mut self) -> Self {
        self.by_controller = true;
        self
    }

    /// Whether objects are hashed by their controller's key.
    #[must_use]
    pub fn is_by_controller(&self) -> bool {
        self.by_controller
    }

    /// The ring key of an object of this resource (`None`: not to be assigned).
    fn key_of(&self, meta: &kube::core::ObjectMeta) -> Option<String> {
        if self.by_controller {
            controller_ring_key(meta)
        } else {
            let name = meta.name.as_deref()?;
            Some(ring_key(
                &self.resource.group,
                &self.resource.kind,
                meta.namespace.as_deref(),
                name,
            ))
        }
    }
}

/// Settings of a [`Sharder`]. `Default` gives timebertt's values where it has them.
///
/// ```
/// use std::time::Duration;
/// use durable_informer::sharding::SharderConfig;
/// let mut config = SharderConfig::default();
/// config.resync_period = Duration::from_secs(60);
/// assert_eq!(config.tokens_per_shard, 100);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SharderConfig {
    /// Virtual nodes per shard on the ring (default 100).
    pub tokens_per_shard: usize,
    /// How often every object is checked again even without events (default 5 minutes),
    /// which also retries writes that failed for good.
    pub resync_period: Duration,
    /// Writes in flight at once during a rebalance (default 16).
    pub concurrent_moves: usize,
    /// Who the sharder is when it takes the Lease of a shard that stopped renewing (default
    /// [`SHARDER_IDENTITY`]).
    pub identity: String,
}

impl Default for SharderConfig {
    fn default() -> Self {
        Self {
            tokens_per_shard: DEFAULT_TOKENS_PER_SHARD,
            resync_period: Duration::from_secs(300),
            concurrent_moves: 16,
            identity: SHARDER_IDENTITY.to_owned(),
        }
    }
}

/// What a running sharder has seen and done ([`Sharder::status`]).
///
/// ```no_run
/// # async fn f(sharder: durable_informer::sharding::Sharder) -> Result<(), Box<dyn std::error::Error>> {
/// use durable_informer::sharding::ShardState;
/// let mut status = sharder.status();
/// let s = status.wait_for(|s| s.synced).await?.clone();
/// let ready = s.shards.values().filter(|st| **st == ShardState::Ready).count();
/// println!("{ready} ready shards, {} drains so far, ring {:?}", s.drains, s.ring);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SharderStatus {
    /// Every shard Lease of the ring, with its state.
    pub shards: BTreeMap<String, ShardState>,
    /// The shards on the ring (available ones), sorted.
    pub ring: Vec<String>,
    /// The Leases and every resource have been listed once.
    pub synced: bool,
    /// Shard labels written: on unassigned objects, objects of dead shards, and owned objects
    /// that followed their owner.
    pub assigned: u64,
    /// Drain labels written (each acknowledged by the object's shard before it moves).
    pub drains: u64,
    /// Writes refused with a conflict (each decided again and retried).
    pub conflicts: u64,
    /// Writes that failed otherwise.
    pub errors: u64,
    /// Leases of shards that stopped renewing, taken by the sharder.
    pub leases_taken: u64,
    /// Leases of dead shards deleted after [`ORPHAN_AFTER`](super::ORPHAN_AFTER).
    pub leases_deleted: u64,
}

/// An object as the sharder keeps it: what it needs to decide, nothing more.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Tracked {
    resource_version: String,
    key: Option<String>,
    shard: Option<String>,
    drain: bool,
}

/// `namespace`, `name`.
type ObjKey = (Option<String>, String);

/// What to write on an object.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Move {
    /// Set the shard label (and drop any drain label).
    Assign(String),
    /// Ask the current shard to let go.
    Drain,
}

/// The decision rule, shared by the loop and the write tasks (which decide again on a conflict).
#[derive(Debug)]
struct Planner {
    labels: RingLabels,
    ring: HashRing,
    states: BTreeMap<String, ShardState>,
}

impl Planner {
    fn track(&self, resource: &ShardedResource, meta: &kube::core::ObjectMeta) -> Tracked {
        let labels = meta.labels.clone().unwrap_or_default();
        Tracked {
            resource_version: meta.resource_version.clone().unwrap_or_default(),
            key: resource.key_of(meta),
            shard: self.labels.assigned(&labels).map(str::to_owned),
            drain: self.labels.draining(&labels),
        }
    }

    fn plan(&self, by_controller: bool, t: &Tracked) -> Option<Move> {
        let desired = self.ring.shard_for(t.key.as_deref()?)?;
        let current = t.shard.as_deref();
        if current == Some(desired) {
            return None;
        }
        let alive = current.is_some_and(|c| self.states.get(c).is_some_and(|s| s.is_available()));
        match current {
            Some(_) if alive && !by_controller => (!t.drain).then_some(Move::Drain),
            _ => Some(Move::Assign(desired.to_owned())),
        }
    }

    fn patch_body(&self, m: &Move, resource_version: &str) -> serde_json::Value {
        let labels = match m {
            Move::Assign(shard) => json!({ self.labels.shard_label(): shard, self.labels.drain_label(): null }),
            Move::Drain => json!({ self.labels.drain_label(): "true" }),
        };
        json!({"metadata": {"resourceVersion": resource_version, "labels": labels}})
    }
}

/// How one write ended.
#[derive(Debug, Default, Clone, Copy)]
struct Outcome {
    assigned: u64,
    drains: u64,
    conflicts: u64,
    errors: u64,
}

type Input = (Option<usize>, InputEvent);

enum InputEvent {
    Lease(Result<Event<Lease>, watcher::Error>),
    Object(Result<Event<PartialObjectMeta<DynamicObject>>, watcher::Error>),
}

/// Assigns a ring's objects to its live shards and moves them when shards come and go
/// (timebertt's sharder, run as a library function).
///
/// Run one per ring, in one replica at a time: behind a
/// [`LeaderElector`](crate::leader::LeaderElector) (`select!` on its leadership), or as its
/// own Deployment. Two sharders at once are not unsafe (every write is conditioned on the
/// object's resourceVersion, and the shards' drain acknowledgement is what lets an object move
/// from a live shard) but do the same work twice.
///
/// ```no_run
/// # async fn f(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
/// use durable_informer::selector::RingLabels;
/// use durable_informer::sharding::{ShardedResource, Sharder};
/// use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
///
/// let sharder = Sharder::new(client, "default", RingLabels::new("web")?)
///     .resource(ShardedResource::of::<Deployment>())
///     .resource(ShardedResource::of::<ReplicaSet>().by_controller());
/// let mut status = sharder.status();
/// let (stop_tx, stop) = tokio::sync::watch::channel(false);
/// let task = tokio::spawn(sharder.run(stop));
/// status.wait_for(|s| s.synced).await?;
/// println!("ring: {:?}", status.borrow().ring);
/// stop_tx.send(true)?;
/// task.await??;
/// # Ok(()) }
/// ```
pub struct Sharder {
    client: kube::Client,
    namespace: String,
    labels: RingLabels,
    resources: Vec<ShardedResource>,
    config: SharderConfig,
    status: watch::Sender<SharderStatus>,
}

impl std::fmt::Debug for Sharder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The client holds credentials: never print it.
        f.debug_struct("Sharder")
            .field("namespace", &self.namespace)
            .field("ring", &self.labels.ring())
            .field("resources", &self.resources)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Sharder {
    /// A sharder of the ring `labels` whose shard Leases live in `lease_namespace`; add the
    /// sharded resources with [`resource`](Self::resource).
    #[must_use]
    pub fn new(client: kube::Client, lease_namespace: &str, labels: RingLabels) -> Self {
        let (status, _) = watch::channel(SharderStatus::default());
        Self {
            client,
            namespace: lease_namespace.to_owned(),
            labels,
            resources: Vec::new(),
            config: SharderConfig::default(),
            status,
        }
    }

    /// Also assigns the objects of `resource` (in every namespace).
    #[must_use]
    pub fn resource(mut self, resource: ShardedResource) -> Self {
        self.resources.push(resource);
        self
    }

    /// Settings (see [`SharderConfig`]).
    #[must_use]
    pub fn config(mut self, config: SharderConfig) -> Self {
        self.config = config;
        self
    }

    /// What the sharder has seen and done, as it changes.
    #[must_use]
    pub fn status(&self) -> watch::Receiver<SharderStatus> {
        self.status.subscribe()
    }

    fn inputs(&self) -> impl Stream<Item = Input> + Send + Unpin + 'static {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
        let lease_events = watcher::watcher(leases, watcher::Config::default().labels(&self.labels.lease_selector()))
            .default_backoff()
            .map(|e| (None, InputEvent::Lease(e)))
            .boxed();
        let mut streams = vec![lease_events];
        for (i, r) in self.resources.iter().enumerate() {
            // `PartialObjectMeta`: metadata-only requests, as timebertt's sharder makes.
            let api: Api<PartialObjectMeta<DynamicObject>> = Api::all_with(self.client.clone(), &r.resource);
            streams.push(
                watcher::watcher(api, watcher::Config::default())
                    .default_backoff()
                    .map(move |e| (Some(i), InputEvent::Object(e)))
                    .boxed(),
            );
        }
        futures::stream::select_all(streams)
    }

    /// Runs until `stop` turns true (or is dropped). Errors of the watches are retried with
    /// backoff and counted in the status, never returned.
    pub async fn run(self, mut stop: watch::Receiver<bool>) -> Result<(), ShardingError> {
        let mut inputs = self.inputs();
        let mut state = State {
            leases: ShardLeases::default(),
            lease_init: None,
            leases_synced: false,
            objects: vec![BTreeMap::new(); self.resources.len()],
            object_init: vec![None; self.resources.len()],
            synced: vec![false; self.resources.len()],
            planner: Arc::new(Planner {
                labels: self.labels.clone(),
                ring: HashRing::default(),
                states: BTreeMap::new(),
            }),
            next_resync: Instant::now() + self.config.resync_period,
            retry_at: None,
        };
        loop {
            let now = Instant::now();
            let wake = [state.leases.next_change(now), Some(state.next_resync), state.retry_at]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(now + self.config.resync_period);
            let mut full_pass: BTreeSet<usize> = BTreeSet::new();
            let mut singles: BTreeSet<(usize, ObjKey)> = BTreeSet::new();
            tokio::select! {
                _ = stop.wait_for(|s| *s) => break,
                input = inputs.next() => {
                    let Some(input) = input else { break };
                    self.on_input(&mut state, input, &mut full_pass, &mut singles);
                    // Take every event already there before deciding: decisions then rest on
                    // the newest state (after a long pass, the queue holds the shards' acks).
                    for _ in 0..MAX_BATCH {
                        match inputs.next().now_or_never() {
                            Some(Some(input)) => self.on_input(&mut state, input, &mut full_pass, &mut singles),
                            _ => break,
                        }
                    }
                }
                () = tokio::time::sleep_until(wake) => {
                    if Instant::now() >= state.next_resync {
                        state.next_resync = Instant::now() + self.config.resync_period;
                        full_pass.extend(0..self.resources.len());
                    }
                    if state.retry_at.is_some_and(|t| Instant::now() >= t) {
                        state.retry_at = None;
                        full_pass.extend(0..self.resources.len());
                    }
                }
            }
            if !state.leases_synced {
                continue;
            }
            if self.refresh_ring(&mut state).await {
                full_pass.extend(0..self.resources.len());
            }
            let mut work = Vec::new();
            for r in &full_pass {
                if !state.synced[*r] {
                    continue;
                }
                for (k, t) in &state.objects[*r] {
                    work.push((*r, k.clone(), t.clone()));
                }
            }
            for (r, k) in singles {
                if full_pass.contains(&r) || !state.synced[r] {
                    continue;
                }
                if let Some(t) = state.objects[r].get(&k) {
                    work.push((r, k, t.clone()));
                }
            }
            let outcome = self.execute(&state.planner, work).await;
            if outcome.errors > 0 {
                state.retry_at.get_or_insert(Instant::now() + Duration::from_secs(1));
            }
            let synced = state.synced.iter().all(|s| *s);
            self.status.send_if_modified(|s| {
                let before = s.clone();
                s.assigned += outcome.assigned;
                s.drains += outcome.drains;
                s.conflicts += outcome.conflicts;
                s.errors += outcome.errors;
                s.synced = synced;
                *s != before
            });
        }
        Ok(())
    }

    fn on_input(
        &self,
        state: &mut State,
        (resource, event): Input,
        full_pass: &mut BTreeSet<usize>,
        singles: &mut BTreeSet<(usize, ObjKey)>,
    ) {
        match (resource, event) {
            (_, InputEvent::Lease(e)) => self.on_lease(state, e),
            (Some(r), InputEvent::Object(e)) => match self.on_object(state, r, e) {
                Changed::All => {
                    full_pass.insert(r);
                }
                Changed::One(k) => {
                    singles.insert((r, k));
                }
                Changed::Nothing => {}
            },
            (None, InputEvent::Object(_)) => {}
        }
    }

    fn on_lease(&self, state: &mut State, event: Result<Event<Lease>, watcher::Error>) {
        let now = Instant::now();
        match event {
            Ok(Event::Init) => state.lease_init = Some(BTreeSet::new()),
            Ok(Event::InitApply(lease)) => {
                if let Some(name) = lease.metadata.name.clone() {
                    if let Some(seen) = &mut state.lease_init {
                        seen.insert(name.clone());
                    }
                    state.leases.observe(&name, LeaseRecord::from(lease), now);
                }
            }
            Ok(Event::InitDone) => {
                if let Some(seen) = state.lease_init.take() {
                    let gone: Vec<String> = state
                        .leases
                        .states(now)
                        .into_keys()
                        .filter(|n| !seen.contains(n))
                        .collect();
                    for n in gone {
                        state.leases.forget(&n);
                    }
                }
                state.leases_synced = true;
            }
            Ok(Event::Apply(lease)) => {
                if let Some(name) = lease.metadata.name.clone() {
                    state.leases.observe(&name, LeaseRecord::from(lease), now);
                }
            }
            Ok(Event::Delete(lease)) => {
                if let Some(name) = &lease.metadata.name {
                    state.leases.forget(name);
                }
            }
            Err(e) => {
                tracing::warn!(ring = self.labels.ring(), error = %e, "watching the shard Leases failed; retrying");
                self.status.send_modify(|s| s.errors += 1);
            }
        }
    }

    fn on_object(
        &self,
        state: &mut State,
        r: usize,
        event: Result<Event<PartialObjectMeta<DynamicObject>>, watcher::Error>,
    ) -> Changed {
        let resource = &self.resources[r];
        let key_of = |o: &PartialObjectMeta<DynamicObject>| -> Option<ObjKey> {
            Some((o.metadata.namespace.clone(), o.metadata.name.clone()?))
        };
        match event {
            Ok(Event::Init) => {
                state.object_init[r] = Some(BTreeMap::new());
                Changed::Nothing
            }
            Ok(Event::InitApply(o)) => {
                if let (Some(k), Some(buf)) = (key_of(&o), &mut state.object_init[r]) {
                    buf.insert(k, state.planner.track(resource, &o.metadata));
                }
                Changed::Nothing
            }
            Ok(Event::InitDone) => {
                if let Some(buf) = state.object_init[r].take() {
                    state.objects[r] = buf;
                }
                state.synced[r] = true;
                Changed::All
            }
            Ok(Event::Apply(o)) => {
                let Some(k) = key_of(&o) else {
                    return Changed::Nothing;
                };
                state.objects[r].insert(k.clone(), state.planner.track(resource, &o.metadata));
                Changed::One(k)
            }
            Ok(Event::Delete(o)) => {
                if let Some(k) = key_of(&o) {
                    state.objects[r].remove(&k);
                }
                Changed::Nothing
            }
            Err(e) => {
                tracing::warn!(ring = self.labels.ring(), resource = %resource.resource.plural, error = %e, "watching the sharded objects failed; retrying");
                self.status.send_modify(|s| s.errors += 1);
                Changed::Nothing
            }
        }
    }

    /// Brings shard states up to date (taking uncertain Leases, deleting orphaned ones) and
    /// rebuilds the ring; true when the ring's shards changed.
    async fn refresh_ring(&self, state: &mut State) -> bool {
        let now = Instant::now();
        for (name, s) in state.leases.states(now) {
            match s {
                ShardState::Uncertain => self.take_lease(state, &name).await,
                ShardState::Orphaned => self.delete_lease(state, &name).await,
                _ => {}
            }
        }
        let now = Instant::now();
        let states = state.leases.states(now);
        let available: Vec<&String> = states
            .iter()
            .filter(|(_, s)| s.is_available())
            .map(|(n, _)| n)
            .collect();
        let changed = state.planner.ring.shards().iter().ne(available.iter().copied());
        if changed || states != state.planner.states {
            let ring = if changed {
                tracing::info!(ring = self.labels.ring(), shards = ?available, "the ring changed");
                HashRing::with_tokens(available, self.config.tokens_per_shard)
            } else {
                state.planner.ring.clone()
            };
            state.planner = Arc::new(Planner {
                labels: self.labels.clone(),
                ring,
                states: states.clone(),
            });
            let ring_shards = state.planner.ring.shards().to_vec();
            self.status.send_modify(|s| {
                s.shards = states;
                s.ring = ring_shards;
            });
        }
        // The ring is exactly the available shards: a shard that died left it, so a change of
        // membership is the only state change that moves objects (ready ⇄ expired moves none).
        changed
    }

    /// Takes the Lease of a shard that stopped renewing, if it is still the one observed: the
    /// shard is then dead for everyone, and can no longer renew without noticing.
    async fn take_lease(&self, state: &mut State, name: &str) {
        let Some(observed) = state.leases.record(name).cloned() else {
            return;
        };
        let lock = KubeLeaseLock::new(self.client.clone(), &self.namespace, name, &self.config.identity);
        let current = match lock.get().await {
            Ok(Some(c)) => c,
            Ok(None) => {
                state.leases.forget(name);
                return;
            }
            Err(e) => {
                tracing::warn!(lease = name, error = %e, "reading an expired shard Lease failed");
                return;
            }
        };
        if current.resource_version != observed.resource_version {
            // Renewed meanwhile: not dead after all.
            state.leases.observe(name, current, Instant::now());
            return;
        }
        let term = if observed.lease_duration.is_zero() {
            Duration::from_secs(15)
        } else {
            observed.lease_duration
        };
        let mut taken = LeaseRecord::held_by(&self.config.identity, term * 2, current.transitions.saturating_add(1));
        taken.resource_version = current.resource_version.clone();
        match lock.update(&taken).await {
            Ok(written) => {
                tracing::warn!(
                    ring = self.labels.ring(),
                    shard = name,
                    "shard stopped renewing its Lease: taken, its objects move"
                );
                state.leases.observe(name, written, Instant::now());
                self.status.send_modify(|s| s.leases_taken += 1);
            }
            Err(e) => tracing::info!(lease = name, error = %e, "taking an expired shard Lease failed; deciding again"),
        }
    }

    async fn delete_lease(&self, state: &mut State, name: &str) {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
        let rv = state.leases.record(name).and_then(|r| r.resource_version.clone());
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: rv,
                uid: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(name, &dp).await {
            Ok(_) => {
                state.leases.forget(name);
                self.status.send_modify(|s| s.leases_deleted += 1);
            }
            Err(kube::Error::Api(s)) if s.code == 404 => state.leases.forget(name),
            Err(e) => tracing::info!(lease = name, error = %e, "deleting an orphaned shard Lease failed"),
        }
    }

    /// Writes what `work` needs, `concurrent_moves` at a time.
    async fn execute(&self, planner: &Arc<Planner>, work: Vec<(usize, ObjKey, Tracked)>) -> Outcome {
        let jobs = work.into_iter().filter_map(|(r, k, t)| {
            let resource = &self.resources[r];
            let first = planner.plan(resource.by_controller, &t)?;
            Some(self.write(planner.clone(), resource.clone(), k, t, first))
        });
        let outcomes: Vec<Outcome> = futures::stream::iter(jobs)
            .buffer_unordered(self.config.concurrent_moves.max(1))
            .collect()
            .await;
        outcomes.into_iter().fold(Outcome::default(), |a, o| Outcome {
            assigned: a.assigned + o.assigned,
            drains: a.drains + o.drains,
            conflicts: a.conflicts + o.conflicts,
            errors: a.errors + o.errors,
        })
    }

    /// One object's write, decided again and retried on conflicts.
    async fn write(
        &self,
        planner: Arc<Planner>,
        resource: ShardedResource,
        (namespace, name): ObjKey,
        mut tracked: Tracked,
        mut next: Move,
    ) -> Outcome {
        let api: Api<DynamicObject> = match &namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &resource.resource),
            None => Api::all_with(self.client.clone(), &resource.resource),
        };
        let mut out = Outcome::default();
        for _ in 0..CONFLICT_RETRIES {
            let body = planner.patch_body(&next, &tracked.resource_version);
            match api.patch(&name, &PatchParams::default(), &Patch::Merge(&body)).await {
                Ok(_) => {
                    match next {
                        Move::Assign(_) => out.assigned += 1,
                        Move::Drain => out.drains += 1,
                    }
                    return out;
                }
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    out.conflicts += 1;
                    let fresh = match api.get_metadata_opt(&name).await {
                        Ok(Some(m)) => m,
                        Ok(None) => return out,
                        Err(e) => {
                            tracing::info!(object = %name, error = %e, "re-reading after a conflict failed");
                            out.errors += 1;
                            return out;
                        }
                    };
                    tracked = planner.track(&resource, &fresh.metadata);
                    match planner.plan(resource.by_controller, &tracked) {
                        Some(m) => next = m,
                        None => return out,
                    }
                }
                // Deleted meanwhile: nothing to assign.
                Err(kube::Error::Api(s)) if s.code == 404 => return out,
                Err(e) => {
                    tracing::warn!(object = %name, resource = %resource.resource.plural, error = %e, "labelling an object failed");
                    out.errors += 1;
                    return out;
                }
            }
        }
        // Still conflicting: the object changes fast; its next event decides again.
        out
    }
}

enum Changed {
    Nothing,
    One(ObjKey),
    All,
}

struct State {
    leases: ShardLeases,
    lease_init: Option<BTreeSet<String>>,
    leases_synced: bool,
    objects: Vec<BTreeMap<ObjKey, Tracked>>,
    object_init: Vec<Option<BTreeMap<ObjKey, Tracked>>>,
    synced: Vec<bool>,
    planner: Arc<Planner>,
    next_resync: Instant,
    retry_at: Option<Instant>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planner(ring: &[&str], states: &[(&str, ShardState)]) -> Planner {
        Planner {
            labels: RingLabels::new("r").unwrap(),
            ring: HashRing::new(ring),
            states: states.iter().map(|(n, s)| ((*n).to_owned(), *s)).collect(),
        }
    }

    fn tracked(key: &str, shard: Option<&str>, drain: bool) -> Tracked {
        Tracked {
            resource_version: "7".into(),
            key: Some(key.into()),
            shard: shard.map(str::to_owned),
            drain,
        }
    }

    #[test]
    fn the_plan_assigns_unassigned_and_dead_shards_objects_and_drains_live_ones() {
        let p = planner(
            &["a"],
            &[
                ("a", ShardState::Ready),
                ("b", ShardState::Ready),
                ("c", ShardState::Dead),
            ],
        );
        // Every key goes to `a`, the only shard on the ring.
        assert_eq!(
            p.plan(false, &tracked("k", None, false)),
            Some(Move::Assign("a".into()))
        );
        assert_eq!(p.plan(false, &tracked("k", Some("a"), false)), None);
        assert_eq!(
            p.plan(false, &tracked("k", Some("c"), false)),
            Some(Move::Assign("a".into()))
        );
        assert_eq!(
            p.plan(false, &tracked("k", Some("gone"), false)),
            Some(Move::Assign("a".into()))
        );
        assert_eq!(p.plan(false, &tracked("k", Some("b"), false)), Some(Move::Drain));
        // Already draining: wait for the shard's acknowledgement.
        assert_eq!(p.plan(false, &tracked("k", Some("b"), true)), None);
        // Owned objects follow their owner directly.
        assert_eq!(
            p.plan(true, &tracked("k", Some("b"), false)),
            Some(Move::Assign("a".into()))
        );
        // No key (an owned object without a controller), or no shard at all: nothing.
        let mut no_key = tracked("k", None, false);
        no_key.key = None;
        assert_eq!(p.plan(false, &no_key), None);
        assert_eq!(planner(&[], &[]).plan(false, &tracked("k", None, false)), None);
    }

    #[test]
    fn patches_carry_the_resource_version_they_were_decided_on() {
        let p = planner(&["a"], &[]);
        let assign = p.patch_body(&Move::Assign("a".into()), "42");
        assert_eq!(assign["metadata"]["resourceVersion"], "42");
        assert_eq!(
            assign["metadata"]["labels"]["shard.alpha.sharding.timebertt.dev/r"],
            "a"
        );
        assert!(assign["metadata"]["labels"]["drain.alpha.sharding.timebertt.dev/r"].is_null());
        let drain = p.patch_body(&Move::Drain, "43");
        assert_eq!(
            drain["metadata"]["labels"]["drain.alpha.sharding.timebertt.dev/r"],
            "true"
        );
        assert!(drain["metadata"]["labels"]
            .get("shard.alpha.sharding.timebertt.dev/r")
            .is_none());
    }
}
